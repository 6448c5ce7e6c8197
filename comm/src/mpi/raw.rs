//! Checked wrappers over the MPI C API (`mpi::ffi`, i.e. `mpi-sys`): return codes become
//! `Result`s carrying MPI's own error string, and requests are waited on with a deadline.
//!
//! Decision: the backend calls the C API rather than rsmpi's safe layer, because that layer
//! discards return codes (so `MPI_ERRORS_RETURN` would turn failures into silent garbage) and
//! its blocking collectives cannot time out. rsmpi's value here is the bindings and the
//! `RSMPI_*` constants, which it builds against the system's `mpi.h`.

use std::os::raw::{c_char, c_int};
use std::time::{Duration, Instant};

use mpi::ffi;

/// An MPI call that returned something other than `MPI_SUCCESS`.
#[derive(Debug, Clone)]
pub(crate) struct MpiFailure {
    /// The MPI function.
    pub call: &'static str,
    /// The error code it returned.
    pub code: c_int,
    /// `MPI_Error_string` of the code.
    pub message: String,
}

impl std::fmt::Display for MpiFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} returned {} ({})", self.call, self.code, self.message)
    }
}

/// Turns a return code into a `Result`.
pub(crate) fn check(call: &'static str, rc: c_int) -> Result<(), MpiFailure> {
    if rc == ffi::MPI_SUCCESS as c_int {
        return Ok(());
    }
    let mut buf = [0 as c_char; ffi::MPI_MAX_ERROR_STRING as usize + 1];
    let mut len: c_int = 0;
    // SAFETY: MPI writes at most MPI_MAX_ERROR_STRING characters into `buf` and their count
    // into `len`; both outlive the call. MPI_Error_string may be called at any time.
    let rc2 = unsafe { ffi::MPI_Error_string(rc, buf.as_mut_ptr(), &mut len) };
    let message = if rc2 == ffi::MPI_SUCCESS as c_int {
        let len = usize::try_from(len).unwrap_or(0).min(buf.len());
        buf[..len].iter().map(|&c| c as u8 as char).collect()
    } else {
        "unknown MPI error".to_string()
    };
    Err(MpiFailure {
        call,
        code: rc,
        message,
    })
}

/// A communicator handle. Freed by its owner (see `Drop for MpiComm`), not here, because a
/// handle with operations that never completed must be leaked instead.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CommHandle(pub ffi::MPI_Comm);

// SAFETY: an MPI_Comm is an opaque handle into the MPI library, which the environment
// initialises with MPI_THREAD_MULTIPLE (checked in `env::Env::init`), so it may be used from any
// thread. The owning `MpiComm` is used by one thread at a time (the communicator's mutex).
unsafe impl Send for CommHandle {}

impl CommHandle {
    /// This process's rank and the group size.
    pub(crate) fn rank_size(self) -> Result<(usize, usize), MpiFailure> {
        let (mut rank, mut size): (c_int, c_int) = (0, 0);
        // SAFETY: `self.0` is a valid communicator; the out-pointers are live locals.
        check("MPI_Comm_rank", unsafe {
            ffi::MPI_Comm_rank(self.0, &mut rank)
        })?;
        // SAFETY: as above.
        check("MPI_Comm_size", unsafe {
            ffi::MPI_Comm_size(self.0, &mut size)
        })?;
        Ok((
            usize::try_from(rank).unwrap_or(0),
            usize::try_from(size).unwrap_or(1),
        ))
    }

    /// Makes errors on this communicator return codes instead of aborting the job.
    pub(crate) fn errors_return(self) -> Result<(), MpiFailure> {
        // SAFETY: valid communicator; RSMPI_ERRORS_RETURN is a predefined handle.
        check("MPI_Comm_set_errhandler", unsafe {
            ffi::MPI_Comm_set_errhandler(self.0, ffi::RSMPI_ERRORS_RETURN)
        })
    }

    /// A new communicator over the same group with its own context (so its messages never
    /// match another communicator's), with errors returned.
    pub(crate) fn dup(self) -> Result<CommHandle, MpiFailure> {
        // SAFETY: RSMPI_COMM_NULL is a predefined handle, overwritten by MPI_Comm_dup.
        let mut out = unsafe { ffi::RSMPI_COMM_NULL };
        // SAFETY: valid communicator; `out` is a live local.
        check("MPI_Comm_dup", unsafe {
            ffi::MPI_Comm_dup(self.0, &mut out)
        })?;
        let out = CommHandle(out);
        out.errors_return()?;
        Ok(out)
    }

    /// Frees the handle. Only for communicators with no operation in flight.
    pub(crate) fn free(mut self) {
        // SAFETY: the caller owns the handle and no operation on it is pending; MPI is still
        // initialised (the owner holds the environment).
        let _ = unsafe { ffi::MPI_Comm_free(&mut self.0) };
    }
}

/// A request that outlived its deadline or failed.
#[derive(Debug)]
pub(crate) enum WaitError {
    /// Not complete after the timeout; the request is still pending and owns its buffers.
    TimedOut(Duration),
    /// MPI reported an error.
    Failed(MpiFailure),
}

/// Waits for `req` until `timeout`, polling with `MPI_Test`.
///
/// Polls spin briefly (latency of small messages), then back off to short sleeps so that
/// oversubscribed ranks (4 processes on 2 cores) leave the CPU to the peers they wait for.
pub(crate) fn wait(mut req: ffi::MPI_Request, timeout: Duration) -> Result<(), WaitError> {
    let start = Instant::now();
    let mut polls: u32 = 0;
    loop {
        let mut done: c_int = 0;
        // SAFETY: `req` is an active request returned by a nonblocking MPI call whose buffers
        // the caller keeps alive (or leaks) until completion; RSMPI_STATUS_IGNORE is allowed.
        let rc = unsafe { ffi::MPI_Test(&mut req, &mut done, ffi::RSMPI_STATUS_IGNORE) };
        check("MPI_Test", rc).map_err(WaitError::Failed)?;
        if done != 0 {
            return Ok(());
        }
        let waited = start.elapsed();
        if waited >= timeout {
            return Err(WaitError::TimedOut(waited));
        }
        polls = polls.saturating_add(1);
        if polls < 2_000 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

/// A null request, to be overwritten by a nonblocking call.
pub(crate) fn null_request() -> ffi::MPI_Request {
    // SAFETY: RSMPI_REQUEST_NULL is a predefined constant handle.
    unsafe { ffi::RSMPI_REQUEST_NULL }
}

/// The byte datatype (`MPI_UINT8_T`): every buffer moves as bytes; reductions happen in our
/// own kernel, so MPI never interprets the elements.
pub(crate) fn bytes_type() -> ffi::MPI_Datatype {
    // SAFETY: predefined constant handle.
    unsafe { ffi::RSMPI_UINT8_T }
}

/// A byte count or offset as MPI's `int`.
pub(crate) fn int(v: usize) -> Option<c_int> {
    c_int::try_from(v).ok()
}
