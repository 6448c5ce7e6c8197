//! Creating an [`NcclComm`]: from a unique id, from torchrun's environment (TCP rendezvous),
//! each bounded by the group's timeout.

use std::os::raw::{c_char, c_int};
use std::rc::Rc;
use std::time::Instant;

use cudarc::nccl::sys;

use super::abort::abort_raw;
use super::comm::{available, new_id, unavailable, NcclComm, UniqueId};
use super::ffi::{self, driver_error, nccl_error, ConfigV2_17};
use super::handle::{poll_until, Handle, Stop};
use crate::bootstrap::{fetch, LaunchEnv, Server};
use crate::config::Config;
use crate::error::{CommError, Result};

impl NcclComm {
    /// Joins the group `id` as `rank` of `size` on GPU `device` (`ncclCommInitRankConfig`,
    /// non-blocking, bounded by `config.timeout`). Collective: every rank must call it.
    ///
    /// # Errors
    /// [`CommError::Unavailable`] without driver, GPU or NCCL, or when not every rank joined
    /// in time; [`CommError::Vendor`] when CUDA or NCCL fail; `InvalidArgument` for
    /// `rank >= size` or a size past `i32::MAX`.
    pub fn from_id(
        id: &UniqueId,
        rank: usize,
        size: usize,
        device: usize,
        config: Config,
    ) -> Result<Self> {
        available()?;
        let (Ok(nranks), Ok(me), true) =
            (c_int::try_from(size), c_int::try_from(rank), rank < size)
        else {
            return Err(CommError::InvalidArgument {
                what: format!("NCCL rank {rank} of {size}"),
            });
        };
        // Untracked (zero_alloc::context): the caller orders its buffers' other streams (S4).
        let ctx = zero_alloc::context::untracked_context(device)
            .map_err(|e| unavailable(format!("GPU {device}: {e}")))?;
        zero_alloc::context::bind(&ctx).map_err(crate::error::bind_error("nccl"))?;
        let stream = ctx.new_stream().map_err(driver_error("cuStreamCreate"))?;
        let scratch = stream
            .alloc_zeros::<f32>(1)
            .map_err(driver_error("cuMemAlloc"))?;
        let uid = sys::ncclUniqueId {
            internal: id.map(|b| b as c_char),
        };
        let mut cfg = ConfigV2_17::non_blocking();
        let mut raw: sys::ncclComm_t = std::ptr::null_mut();
        // SAFETY: `raw` and `cfg` are live locals, `uid` is passed by value, the counts fit
        // C ints (checked above) and the device's context is current on this thread.
        let rc = unsafe { sys::ncclCommInitRankConfig(&mut raw, nranks, uid, me, cfg.as_nccl()) };
        ffi::check("ncclCommInitRankConfig", rc)?;
        let deadline = Instant::now() + config.timeout;
        // SAFETY: S1 (`raw` was just created), S2 (it has not left this thread).
        if let Err(stop) = unsafe { poll_until(raw, deadline, || Ok(true)) } {
            // SAFETY: S1: `raw` is not used after this. A failed abort is logged there;
            // the error returned is why the join failed.
            let _logged = unsafe { abort_raw(raw) };
            return Err(match stop {
                Stop::Failed(code) => nccl_error("ncclCommInitRankConfig", code),
                Stop::Other(e) => e,
                Stop::TimedOut(waited) => unavailable(format!(
                    "ncclCommInitRankConfig (rank {rank} of {size}) did not finish within \
                     {waited:?}: not every rank joined"
                )),
            });
        }
        let handle = Rc::new(Handle::new(raw, rank, size, config));
        Ok(NcclComm {
            handle,
            stream,
            scratch: scratch.into(),
        })
    }

    /// Joins the job torchrun (or a launcher like it) started: `RANK`, `WORLD_SIZE`,
    /// `LOCAL_RANK` (the GPU), and rank 0's id served at `MASTER_ADDR:MASTER_PORT`.
    ///
    /// # Errors
    /// As [`NcclComm::from_launch`], and [`CommError::Launch`] naming a bad variable.
    pub fn from_env(config: Config) -> Result<Self> {
        available()?;
        Self::from_launch(&LaunchEnv::from_env()?, config)
    }

    /// As [`NcclComm::from_env`], with the launch description given.
    ///
    /// # Errors
    /// As [`NcclComm::from_id`], and [`CommError::Rendezvous`] when the id cannot be moved.
    pub fn from_launch(env: &LaunchEnv, config: Config) -> Result<Self> {
        available()?;
        let master = env.master();
        let id: UniqueId = if env.rank == 0 {
            let server = Server::bind(&master)?; // listen before peers give up retrying
            let id = new_id()?;
            server.serve(&id, env.world_size, config.timeout)?;
            id
        } else {
            let bytes = fetch(&master, env.rank, config.timeout)?;
            bytes
                .try_into()
                .map_err(|b: Vec<u8>| CommError::Rendezvous {
                    addr: master.clone(),
                    what: format!("received {} bytes; an NCCL id has 128", b.len()),
                })?
        };
        Self::from_id(&id, env.rank, env.world_size, env.local_rank, config)
    }
}
