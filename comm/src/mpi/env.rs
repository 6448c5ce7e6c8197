//! The process's MPI environment: initialised once with `MPI_THREAD_MULTIPLE`, finalised when
//! the last handle that needs it (the [`Mpi`](super::Mpi) value and every communicator made
//! from it) is dropped.

use std::os::raw::c_int;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use mpi::ffi;

use super::raw::check;
use crate::error::{CommError, Result};

/// Proof that MPI is initialised; `Drop` of the last one finalises it (if we initialised it).
#[derive(Debug)]
pub(crate) struct Env {
    /// False when someone else (e.g. rsmpi's `Universe`) initialised MPI: they finalise it.
    owned: bool,
}

static CURRENT: Mutex<Weak<Env>> = Mutex::new(Weak::new());

fn unavailable(what: String) -> CommError {
    CommError::Unsupported {
        backend: "mpi",
        what,
    }
}

fn flag(f: unsafe extern "C" fn(*mut c_int) -> c_int, name: &'static str) -> Result<bool> {
    let mut v: c_int = 0;
    // SAFETY: MPI_Initialized / MPI_Finalized may be called at any time, from any thread.
    check(name, unsafe { f(&mut v) }).map_err(|e| unavailable(e.to_string()))?;
    Ok(v != 0)
}

impl Env {
    /// Returns the live environment or initialises MPI.
    ///
    /// # Errors
    /// MPI was already finalised in this process, initialisation failed, or the library does
    /// not provide `MPI_THREAD_MULTIPLE` (the progress thread and split communicators call MPI
    /// from several threads).
    pub(crate) fn init() -> Result<Arc<Env>> {
        let mut current = CURRENT.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(env) = current.upgrade() {
            return Ok(env);
        }
        if flag(ffi::MPI_Finalized, "MPI_Finalized")? {
            return Err(unavailable(
                "initialising MPI after it was finalised (keep the `Mpi` value alive for the \
                 whole program)"
                    .into(),
            ));
        }
        let owned = !flag(ffi::MPI_Initialized, "MPI_Initialized")?;
        // SAFETY: reading predefined integer constants.
        let multiple = unsafe { ffi::RSMPI_THREAD_MULTIPLE };
        let mut provided: c_int = 0;
        if owned {
            // SAFETY: MPI is neither initialised nor finalised (checked above, under the lock
            // that serialises this function); null argc/argv are allowed by MPI-2 and later.
            let rc = unsafe {
                ffi::MPI_Init_thread(
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    multiple,
                    &mut provided,
                )
            };
            check("MPI_Init_thread", rc).map_err(|e| unavailable(e.to_string()))?;
        } else {
            // SAFETY: MPI is initialised; `provided` is a live local.
            let rc = unsafe { ffi::MPI_Query_thread(&mut provided) };
            check("MPI_Query_thread", rc).map_err(|e| unavailable(e.to_string()))?;
        }
        let env = Arc::new(Env { owned });
        if provided < multiple {
            return Err(unavailable(format!(
                "this MPI library provides thread level {provided}, not MPI_THREAD_MULTIPLE \
                 ({multiple})"
            )));
        }
        *current = Arc::downgrade(&env);
        Ok(env)
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        // A finalize error has nowhere to go (we are in Drop and the library is shutting
        // down); the process exit status is the caller's.
        if let Ok(false) = flag(ffi::MPI_Finalized, "MPI_Finalized") {
            // SAFETY: we initialised MPI and this is the last handle on it: no communicator
            // of ours is alive, so no operation of ours is pending.
            let _ = unsafe { ffi::MPI_Finalize() };
        }
    }
}
