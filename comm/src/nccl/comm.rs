//! [`NcclComm`]: the probe that turns a missing GPU or library into an error, the unique id,
//! accessors and barrier. Creation is in `init.rs` (and `mpi.rs`), split in `split.rs`.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use cudarc::nccl::result;

use super::ffi::{driver_error, nccl_error};
use super::group::Group;
use super::handle::Handle;
use crate::config::Config;
use crate::error::{CommError, Result};
use crate::record::{History, Stats};
use crate::reduce_op::ReduceOp;

/// NCCL's unique id: made by rank 0 ([`new_id`]), moved to every rank by a bootstrap.
pub type UniqueId = [u8; 128];

pub(super) fn unavailable(why: impl Into<String>) -> CommError {
    CommError::Unavailable {
        backend: "nccl",
        why: why.into(),
    }
}

/// Checks that the CUDA driver, a GPU and `libnccl` are there, without panicking (cudarc
/// panics on the first call into a library it cannot load).
///
/// # Errors
/// [`CommError::Unavailable`] saying what is missing.
pub fn available() -> Result<()> {
    use zero_alloc::CudaLibrary::{Driver, Nccl};
    zero_alloc::CudaLibrary::require_all(&[Driver, Nccl])
        .map_err(|e| unavailable(e.to_string()))?;
    match CudaContext::device_count() {
        Ok(n) if n > 0 => Ok(()),
        Ok(_) => Err(unavailable("the CUDA driver sees no GPU")),
        Err(e) => Err(unavailable(format!("the CUDA driver reports {:?}", e.0))),
    }
}

/// A fresh unique id (`ncclGetUniqueId`), on rank 0.
///
/// # Errors
/// [`CommError::Unavailable`] as [`available`]; [`CommError::Vendor`] when NCCL fails.
pub fn new_id() -> Result<UniqueId> {
    available()?;
    let id = result::get_uniqueid().map_err(|e| nccl_error("ncclGetUniqueId", e.0))?;
    Ok(id.internal.map(|c| c as u8))
}

/// One rank's NCCL communicator over one GPU. Not `Send`: create and use it on one thread.
#[derive(Debug)]
pub struct NcclComm {
    pub(super) handle: Rc<Handle>,
    pub(super) stream: Arc<CudaStream>,
    /// The one element a barrier all-reduces.
    pub(super) scratch: RefCell<CudaSlice<f32>>,
}

impl NcclComm {
    /// This rank, in `0..size()`.
    pub fn rank(&self) -> usize {
        self.handle.rank
    }
    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.handle.size
    }
    /// The GPU's ordinal.
    pub fn device(&self) -> usize {
        self.stream.context().ordinal()
    }
    /// The stream collectives run on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
    /// The group's settings.
    pub fn config(&self) -> Config {
        self.handle.config
    }
    /// Counters since creation (times are enqueue times).
    pub fn stats(&self) -> Stats {
        self.handle.recorder.borrow().stats
    }
    /// The last launches, oldest first.
    pub fn history(&self) -> History {
        self.handle.recorder.borrow().history.clone()
    }

    /// A new, empty group of collectives to launch together.
    pub fn group(&self) -> Group<'_> {
        Group::new(&self.handle, &self.stream)
    }

    /// Orders later collectives after the work queued so far on `producer` (an event, no
    /// host wait).
    ///
    /// # Errors
    /// [`CommError::Vendor`] when CUDA fails.
    pub fn wait_for(&self, producer: &CudaStream) -> Result<()> {
        self.stream
            .join(producer)
            .map_err(driver_error("cuStreamWaitEvent"))
    }

    /// Returns once every rank called it: a one-element all-reduce (NCCL has no barrier),
    /// which the history shows as such.
    ///
    /// # Errors
    /// As [`NcclWork::wait`](super::NcclWork::wait).
    pub fn barrier(&self) -> Result<()> {
        let mut scratch = self.scratch.borrow_mut();
        let mut g = Group::new(&self.handle, &self.stream);
        g.all_reduce_in_place(&mut *scratch, ReduceOp::Sum)?;
        g.launch()?.wait()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bootstrap::LaunchEnv;

    fn libraries_present() -> bool {
        use zero_alloc::CudaLibrary::{Driver, Nccl};
        Driver.is_present() && Nccl.is_present()
    }

    fn assert_unavailable(r: Result<impl std::fmt::Debug>) {
        match r {
            Err(CommError::Unavailable {
                backend: "nccl",
                why,
            }) => {
                assert!(why.contains("libcuda") || why.contains("libnccl"), "{why}");
            }
            other => panic!("expected Unavailable, got {other:?}"),
        }
    }

    #[test]
    fn asking_for_nccl_without_its_libraries_is_an_error_not_a_panic() {
        if libraries_present() {
            eprintln!("skipped: this machine has the CUDA driver and NCCL");
            return;
        }
        assert_unavailable(available());
        assert_unavailable(new_id());
        assert_unavailable(NcclComm::from_id(&[0; 128], 0, 1, 0, Config::default()));
        // The probe comes before any network traffic: no server listens at this address.
        let env = LaunchEnv {
            rank: 1,
            world_size: 2,
            local_rank: 1,
            master_addr: "127.0.0.1".into(),
            master_port: 9,
        };
        assert_unavailable(NcclComm::from_launch(&env, Config::default()));
    }
}
