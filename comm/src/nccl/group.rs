//! Launching collectives: a [`Group`] collects planned collectives and enqueues them between
//! `ncclGroupStart` and `ncclGroupEnd` (steps 1-4 of the protocol in the module docs).

use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{CudaStream, CudaView, DevicePtr, DevicePtrMut, SyncOnDrop};
use cudarc::nccl::sys;

use super::enqueue::{call_name, describe, enqueue};
use super::ffi::{self, driver_error};
use super::handle::Handle;
use super::layout::{plan, Launch, Side};
use super::work::NcclWork;
use crate::communicator::Collective;
use crate::dtype::DType;
use crate::element::Element;
use crate::error::{BreakCause, Result};
use crate::op::{OpDesc, OpKind};
use crate::reduce_op::ReduceOp;

/// A device buffer by address: `len` elements from device address `ptr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawDeviceBuf {
    /// The first element's device address.
    pub ptr: u64,
    /// Elements (of the collective's dtype).
    pub len: usize,
}

impl RawDeviceBuf {
    /// The address one past the last byte, checked not to overflow.
    fn end(self, dtype: DType) -> Result<u64> {
        let bytes = u64::try_from(self.len)
            .ok()
            .and_then(|n| n.checked_mul(dtype.size() as u64));
        bytes.and_then(|b| self.ptr.checked_add(b)).ok_or_else(|| {
            crate::error::CommError::InvalidArgument {
                what: format!(
                    "{} elements of {dtype:?} from device address {:#x} overflow an address",
                    self.len, self.ptr
                ),
            }
        })
    }
}

/// One planned collective, holding its buffers' guards until after the enqueue (S4).
#[derive(Debug)]
pub(super) struct Pending<'a> {
    pub call: Collective,
    pub dtype: DType,
    pub launch: Launch,
    pub send: CUdeviceptr,
    pub recv: CUdeviceptr,
    _guards: (Option<SyncOnDrop<'a>>, Option<SyncOnDrop<'a>>),
}

/// Collectives launched together (`ncclGroupStart` / `ncclGroupEnd`): a bucket's worth of
/// reduce-scatters, or a single call. Nothing reaches NCCL before [`Group::launch`], so a
/// length error leaves the communicator untouched.
///
/// Layouts are NCCL's: out-of-place reduce-scatter takes `size * recv.len()` elements, in
/// place it leaves rank r's chunk at `r * len / size`; all-gather in place reads rank r's input
/// from there. Off the root, broadcast's `send` and reduce's `recv` may be `None`.
#[derive(Debug)]
pub struct Group<'a> {
    handle: &'a Rc<Handle>,
    stream: &'a Arc<CudaStream>,
    ops: Vec<Pending<'a>>,
}

macro_rules! out_of_place {
    ($(#[$doc:meta])* $name:ident, ($($arg:ident: $ty:ty),*), $call:expr, $send:expr, $recv:expr) => {
        $(#[$doc])*
        ///
        /// # Errors
        /// [`CommError::Length`](crate::CommError::Length), `Root` or `InvalidArgument` when the
        /// buffers do not fit the call.
        pub fn $name<T: Element, S: DevicePtr<T>, R: DevicePtrMut<T>>(
            &mut self, $($arg: $ty),*
        ) -> Result<()> {
            self.push::<T, S, R>($call, false, $send, $recv)
        }
    };
}

macro_rules! in_place {
    ($(#[$doc:meta])* $name:ident, ($($arg:ident: $ty:ty),*), $call:expr) => {
        $(#[$doc])*
        ///
        /// # Errors
        /// As the out-of-place form.
        pub fn $name<T: Element, R: DevicePtrMut<T>>(
            &mut self, buf: &'a mut R, $($arg: $ty),*
        ) -> Result<()> {
            self.push::<T, CudaView<'a, T>, R>($call, true, None, Some(buf))
        }
    };
}

impl<'a> Group<'a> {
    pub(crate) fn new(handle: &'a Rc<Handle>, stream: &'a Arc<CudaStream>) -> Self {
        Group {
            handle,
            stream,
            ops: Vec::new(),
        }
    }

    out_of_place!(/// `recv = op(send of every rank)`.
        all_reduce, (send: &'a S, recv: &'a mut R, op: ReduceOp),
        Collective::AllReduce(op), Some(send), Some(recv));
    in_place!(/// In-place all-reduce.
        all_reduce_in_place, (op: ReduceOp), Collective::AllReduce(op));
    out_of_place!(/// Rank r gets chunk r of the reduction of every rank's `send`.
        reduce_scatter, (send: &'a S, recv: &'a mut R, op: ReduceOp),
        Collective::ReduceScatter(op), Some(send), Some(recv));
    in_place!(/// In-place reduce-scatter (NCCL's layout: rank r's chunk at offset r).
        reduce_scatter_in_place, (op: ReduceOp), Collective::ReduceScatter(op));
    out_of_place!(/// `recv` = every rank's `send`, in rank order.
        all_gather, (send: &'a S, recv: &'a mut R), Collective::AllGather, Some(send), Some(recv));
    in_place!(/// In-place all-gather (rank r's input at chunk r).
        all_gather_in_place, (), Collective::AllGather);
    out_of_place!(/// Every `recv` gets the root's `send` (`None` off the root).
        broadcast, (send: Option<&'a S>, recv: &'a mut R, root: usize),
        Collective::Broadcast(root), send, Some(recv));
    in_place!(/// In-place broadcast of the root's buffer.
        broadcast_in_place, (root: usize), Collective::Broadcast(root));
    out_of_place!(/// The root's `recv` gets `op(send of every rank)` (`None` off the root).
        reduce, (send: &'a S, recv: Option<&'a mut R>, op: ReduceOp, root: usize),
        Collective::Reduce(op, root), Some(send), recv);
    in_place!(/// In-place reduce into the root's buffer.
        reduce_in_place, (op: ReduceOp, root: usize), Collective::Reduce(op, root));

    /// Plans `call` over buffers given by address (memory that cudarc does not own, such as
    /// an arena's blocks), with the typed forms' layouts: `in_place` takes `recv` as the one
    /// buffer; `None` only where NCCL ignores the argument. Lengths are checked by the same
    /// plan as the typed forms' (S3's bound on offsets and counts).
    ///
    /// # Errors
    /// As the typed forms; `InvalidArgument` when a range's end overflows an address.
    /// Nothing reaches NCCL before [`Group::launch`].
    ///
    /// # Safety
    /// For each buffer, the caller keeps the half of S3 and S4 that cudarc's guards keep for
    /// the typed forms:
    /// - `ptr .. ptr + len * dtype.size()` is device memory of the communicator's GPU, and
    ///   stays allocated until the group's collectives finished ([`NcclWork::wait`] returned
    ///   `Ok`, or the communicator was aborted); dropping the [`NcclWork`] does not wait;
    /// - every write to it queued before the launch on another stream is ordered before the
    ///   launch (a host synchronisation, or [`NcclComm::wait_for`](super::NcclComm::wait_for)),
    ///   and until the collectives finished nothing else writes it, nor reads a `recv`.
    pub unsafe fn push_raw(
        &mut self,
        call: Collective,
        dtype: DType,
        in_place: bool,
        send: Option<RawDeviceBuf>,
        recv: Option<RawDeviceBuf>,
    ) -> Result<()> {
        let (rank, size) = (self.handle.rank, self.handle.size);
        call.check_reduction(dtype)?;
        let launch = plan(
            call,
            rank,
            size,
            in_place,
            send.map(|b| b.len),
            recv.map(|b| b.len),
        )?;
        for buf in send.iter().chain(recv.iter()) {
            buf.end(dtype)?;
        }
        let elem = dtype.size() as u64;
        // Offsets are inside the buffers (S3), whose ends were checked above not to overflow.
        let at = |side: Side| match side {
            Side::Send(o) => send.map_or(0, |b| b.ptr + o as u64 * elem),
            Side::Recv(o) => recv.map_or(0, |b| b.ptr + o as u64 * elem),
            Side::Null => 0,
        };
        self.ops.push(Pending {
            call,
            dtype,
            launch,
            send: at(launch.send),
            recv: at(launch.recv),
            _guards: (None, None),
        });
        Ok(())
    }

    /// Plans one collective and takes its device pointers on the communicator's stream.
    fn push<T: Element, S: DevicePtr<T>, R: DevicePtrMut<T>>(
        &mut self,
        call: Collective,
        in_place: bool,
        send: Option<&'a S>,
        recv: Option<&'a mut R>,
    ) -> Result<()> {
        let (rank, size) = (self.handle.rank, self.handle.size);
        call.check_reduction(T::DTYPE)?;
        let send_len = send.map(|s| s.len());
        let recv_len = recv.as_ref().map(|r| r.len());
        let launch = plan(call, rank, size, in_place, send_len, recv_len)?;
        let stream: &'a CudaStream = self.stream;
        let (sp, sg) = send.map(|s| s.device_ptr(stream)).unzip();
        let (rp, rg) = recv.map(|r| r.device_ptr_mut(stream)).unzip();
        let elem = std::mem::size_of::<T>() as u64;
        // Offsets are inside the buffers (S3), so the additions cannot overflow.
        let at = |side: Side| match side {
            Side::Send(o) => sp.map_or(0, |p| p + o as u64 * elem),
            Side::Recv(o) => rp.map_or(0, |p| p + o as u64 * elem),
            Side::Null => 0,
        };
        self.ops.push(Pending {
            call,
            dtype: T::DTYPE,
            launch,
            send: at(launch.send),
            recv: at(launch.recv),
            _guards: (sg, rg),
        });
        Ok(())
    }

    /// Enqueues every collective of the group on the communicator's stream.
    ///
    /// # Errors
    /// [`CommError::Vendor`](crate::CommError::Vendor) when NCCL refuses the launch (the
    /// communicator is then aborted: peers may have launched their part), `Broken` after an
    /// earlier failure, `Timeout` when NCCL stays in progress past the group's timeout.
    pub fn launch(self) -> Result<NcclWork> {
        let h = self.handle;
        let descs: Vec<OpDesc> = self.ops.iter().map(|p| describe(h, p)).collect();
        let first = match descs.first() {
            Some(d) => *d,
            None => h.next_desc(OpKind::Barrier, None, 0, None, None),
        };
        let raw = h.raw(&first)?;
        let ctx = self.stream.context();
        zero_alloc::context::bind(ctx).map_err(crate::error::bind_error("nccl"))?;
        let started = Instant::now();
        let deadline = started + h.config.timeout;
        // SAFETY: opens NCCL's per-thread group; takes no pointer (S2: this thread only).
        ffi::check("ncclGroupStart", unsafe { sys::ncclGroupStart() })?;
        let mut failed = None;
        for p in &self.ops {
            // SAFETY: S1 (`raw` is live: `Handle::raw` checked it), S2, S3 (`p` is a plan).
            let rc = unsafe { enqueue(raw, p, self.stream) };
            if let Err(e) = ffi::check(call_name(p.call), rc) {
                failed = Some(e);
                break;
            }
        }
        // SAFETY: closes the group opened above, which must happen even after a failure.
        let ended = ffi::check("ncclGroupEnd", unsafe { sys::ncclGroupEnd() });
        let result = match (failed, ended) {
            (Some(e), _) | (None, Err(e)) => {
                h.abort(BreakCause::Failed {
                    rank: h.rank,
                    what: e.to_string(),
                });
                Err(e)
            }
            (None, Ok(_)) => h.wait(&first, deadline, || Ok(true)),
        };
        for d in &descs {
            h.record(d, started, result.is_ok());
        }
        result?;
        let event = self
            .stream
            .record_event(None)
            .map_err(driver_error("cuEventRecord"))?;
        drop(self.ops); // the guards record the buffers' events after NCCL's kernels (S4)
        Ok(NcclWork {
            event,
            desc: first,
            deadline,
            handle: Rc::clone(h),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::CommError;

    #[test]
    fn a_raw_range_ends_after_its_last_byte_or_is_refused_when_that_overflows() {
        let buf = RawDeviceBuf {
            ptr: 0x1000,
            len: 3,
        };
        assert_eq!(buf.end(DType::F32).unwrap(), 0x1000 + 3 * 4);
        assert_eq!(buf.end(DType::Bf16).unwrap(), 0x1000 + 3 * 2);
        let past = RawDeviceBuf {
            ptr: u64::MAX - 6,
            len: 3,
        };
        assert_eq!(past.end(DType::F16).unwrap(), u64::MAX);
        assert!(matches!(
            past.end(DType::F32),
            Err(CommError::InvalidArgument { .. })
        ));
    }
}
