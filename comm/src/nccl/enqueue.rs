//! One planned collective to NCCL's call: the only place the five `nccl*` collectives are
//! called.

use std::ffi::c_void;
use std::os::raw::c_int;

use cudarc::driver::CudaStream;
use cudarc::nccl::sys;

use super::ffi::{data_type, red_op};
use super::group::Pending;
use super::handle::Handle;
use crate::communicator::Collective;
use crate::op::OpDesc;

pub(super) fn describe(h: &Handle, p: &Pending<'_>) -> OpDesc {
    let (op, root) = match p.call {
        Collective::AllReduce(op) | Collective::ReduceScatter(op) => (Some(op), None),
        Collective::AllGather => (None, None),
        Collective::Broadcast(root) => (None, Some(root)),
        Collective::Reduce(op, root) => (Some(op), Some(root)),
    };
    h.next_desc(p.call.kind(), Some(p.dtype), p.launch.whole, root, op)
}

pub(super) fn call_name(call: Collective) -> &'static str {
    match call {
        Collective::AllReduce(_) => "ncclAllReduce",
        Collective::ReduceScatter(_) => "ncclReduceScatter",
        Collective::AllGather => "ncclAllGather",
        Collective::Broadcast(_) => "ncclBroadcast",
        Collective::Reduce(..) => "ncclReduce",
    }
}

/// Enqueues one planned collective.
///
/// # Safety
/// `raw` is live and used by this thread only (S1, S2); `p` came from `layout::plan` on buffers
/// that are still borrowed (S3).
pub(super) unsafe fn enqueue(
    raw: sys::ncclComm_t,
    p: &Pending<'_>,
    stream: &CudaStream,
) -> sys::ncclResult_t {
    let (s, r) = (p.send as *const c_void, p.recv as *mut c_void);
    let (n, t) = (p.launch.count, data_type(p.dtype));
    let st = stream.cu_stream() as sys::cudaStream_t;
    // Roots are below the group size, which fits a C int (checked at creation).
    let root = |x: usize| x as c_int;
    // SAFETY: the caller's contract; NCCL's pointer and count arguments come from the plan.
    unsafe {
        match p.call {
            Collective::AllReduce(op) => sys::ncclAllReduce(s, r, n, t, red_op(op), raw, st),
            Collective::ReduceScatter(op) => {
                sys::ncclReduceScatter(s, r, n, t, red_op(op), raw, st)
            }
            Collective::AllGather => sys::ncclAllGather(s, r, n, t, raw, st),
            Collective::Broadcast(x) => sys::ncclBroadcast(s, r, n, t, root(x), raw, st),
            Collective::Reduce(op, x) => sys::ncclReduce(s, r, n, t, red_op(op), root(x), raw, st),
        }
    }
}
