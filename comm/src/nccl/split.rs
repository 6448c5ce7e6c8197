//! `ncclCommSplit`: data-parallel x model-parallel groups from one communicator.

use std::os::raw::c_int;
use std::rc::Rc;
use std::time::Instant;

use cudarc::nccl::sys;

use super::abort::abort_raw;
use super::comm::NcclComm;
use super::ffi::{self, driver_error};
use super::handle::{poll_until, Handle};
use crate::error::{BreakCause, CommError, Result};
use crate::op::OpKind;

impl NcclComm {
    /// Splits the group (`ncclCommSplit`): ranks passing the same `color` form a new
    /// communicator on the same GPU, ranked by (`key`, old rank). Collective.
    ///
    /// # Errors
    /// `InvalidArgument` for a color or key past `i32::MAX`; `Timeout` / `Broken` /
    /// `Vendor` as for a collective (a failed split aborts this communicator).
    pub fn split(&self, color: u32, key: u32) -> Result<NcclComm> {
        let h = &self.handle;
        let (Ok(c), Ok(k)) = (c_int::try_from(color), c_int::try_from(key)) else {
            let what = format!("split: color {color} and key {key} must fit a C int");
            return Err(CommError::InvalidArgument { what });
        };
        let desc = h.next_desc(OpKind::Split, None, 0, None, None);
        let started = Instant::now();
        let raw = h.raw(&desc)?;
        let ctx = self.stream.context();
        zero_alloc::context::bind(ctx).map_err(crate::error::bind_error("nccl"))?;
        let stream = ctx.new_stream().map_err(driver_error("cuStreamCreate"))?;
        let scratch = stream
            .alloc_zeros::<f32>(1)
            .map_err(driver_error("cuMemAlloc"))?;
        let mut child: sys::ncclComm_t = std::ptr::null_mut();
        // SAFETY: S1 (`raw` is live: checked above), S2; `child` is a live local; a null
        // config makes the child inherit this communicator's (non-blocking) one.
        let rc = unsafe { sys::ncclCommSplit(raw, c, k, &mut child, std::ptr::null_mut()) };
        if let Err(e) = ffi::check("ncclCommSplit", rc) {
            h.abort(BreakCause::Failed {
                rank: h.rank,
                what: e.to_string(),
            });
            return Err(e);
        }
        let deadline = started + h.config.timeout;
        let settled = h.wait(&desc, deadline, || Ok(true)).and_then(|()| {
            // SAFETY: S1 (`child` was just created by NCCL), S2.
            unsafe { poll_until(child, deadline, || Ok(true)) }.map_err(|s| h.fail(&desc, s))
        });
        let (mut r, mut n): (c_int, c_int) = (0, 0);
        let counted = settled.and_then(|()| {
            // SAFETY: S1 (`child` settled and live), S2; the out-pointers are live locals.
            let rc = unsafe { sys::ncclCommUserRank(child, &mut r) };
            ffi::check("ncclCommUserRank", rc)?;
            // SAFETY: as above.
            ffi::check("ncclCommCount", unsafe {
                sys::ncclCommCount(child, &mut n)
            })
        });
        h.record(&desc, started, counted.is_ok());
        if let Err(e) = counted {
            // SAFETY: S1: `child` is null (never created) or not used after this. A failed
            // abort is logged there; the error returned is why the split failed.
            let _logged = unsafe { abort_raw(child) };
            return Err(e);
        }
        let (rank, size) = (r.max(0) as usize, n.max(0) as usize);
        let handle = Rc::new(Handle::new(child, rank, size, h.config));
        Ok(NcclComm {
            handle,
            stream,
            scratch: scratch.into(),
        })
    }
}
