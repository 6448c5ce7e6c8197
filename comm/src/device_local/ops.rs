//! The device operations the protocol is written over, and their host implementation.
//!
//! [`HostOps`] is the reference model of the CUDA flavour: addresses are host pointers, a
//! copy is a memcpy, and the reduction is the per-element loop the CUDA kernel runs
//! (`reduce.cu`): widen each input to f32 in rank order, sum (or max/min), divide by the
//! number of ranks for Avg, round once to the element type.

use crate::dtype::DType;
use crate::element::F32Element;
use crate::error::CommError;
use crate::error::Result;
use crate::reduce_op::ReduceOp;

/// Stream-ordered operations on one rank's device (or host, for [`HostOps`]).
///
/// Work is issued in order on the rank's own stream; [`DeviceOps::record`] marks the work
/// issued so far and another rank's [`DeviceOps::wait`] on that mark orders its later work
/// after it.
pub trait DeviceOps: Send {
    /// A mark in the stream that other ranks' streams can wait on.
    type Event: Send + Sync;

    /// Enqueues a copy of `bytes` bytes from `src` to `dst`.
    ///
    /// # Safety
    /// `src` readable and `dst` writable for `bytes` bytes when the copy runs, the ranges
    /// disjoint, and no other work writes either range until the copy is complete.
    unsafe fn copy(&self, dst: u64, src: u64, bytes: usize) -> Result<()>;

    /// Enqueues `dst[i] = op(srcs[0][i], srcs[1][i], ...)` for `i < elems`, combined in the
    /// order of `srcs` and accumulated in f32.
    ///
    /// # Safety
    /// Every `srcs[k]` readable and `dst` writable for `elems` elements of `dtype` when the
    /// reduction runs; `dst` either disjoint from or equal to each source; no other work
    /// writes these ranges until the reduction is complete.
    unsafe fn reduce_in_rank_order(
        &self,
        dtype: DType,
        op: ReduceOp,
        dst: u64,
        srcs: &[u64],
        elems: usize,
    ) -> Result<()>;

    /// Marks the work issued so far.
    fn record(&self) -> Result<Self::Event>;

    /// Orders work issued after this call behind `event` (recorded by any rank).
    fn wait(&self, event: &Self::Event) -> Result<()>;

    /// Blocks the calling thread until the work issued so far is complete.
    fn synchronize(&self) -> Result<()>;
}

/// [`DeviceOps`] over host memory: every operation completes before it returns, so events
/// carry nothing.
#[derive(Debug, Default, Clone, Copy)]
pub struct HostOps;

fn ptr(addr: u64) -> *mut u8 {
    // Addresses come from `expose_provenance` in the typed front-end (`host_run`); u64 holds
    // a usize on every 64-bit target this crate builds for.
    std::ptr::with_exposed_provenance_mut(addr as usize)
}

/// The per-element model of the CUDA kernel for one element type.
///
/// # Safety
/// As [`DeviceOps::reduce_in_rank_order`], with `T` the element type of `dtype`.
unsafe fn reduce_elements<T: F32Element>(op: ReduceOp, dst: u64, srcs: &[u64], elems: usize) {
    let (dst, srcs): (*mut T, Vec<*const T>) = (
        ptr(dst).cast(),
        srcs.iter().map(|&s| ptr(s).cast_const().cast()).collect(),
    );
    for i in 0..elems {
        let mut acc = 0.0f32;
        for (k, src) in srcs.iter().enumerate() {
            // SAFETY: S3 of the module doc in `mod.rs` (bounds): `i < elems` and every source
            // is readable for `elems` elements; reads happen before the write below.
            let x = unsafe { src.add(i).read_unaligned() }.to_f32();
            acc = match (k, op) {
                (0, _) => x,
                (_, ReduceOp::Sum | ReduceOp::Avg) => acc + x,
                (_, ReduceOp::Max) => acc.max(x),
                (_, ReduceOp::Min) => acc.min(x),
            };
        }
        if op == ReduceOp::Avg {
            acc /= srcs.len() as f32;
        }
        // SAFETY: S3 (bounds): `dst` is writable for `elems` elements; a source equal to
        // `dst` was read for element i above and is not read again for it.
        unsafe { dst.add(i).write_unaligned(T::from_f32(acc)) };
    }
}

/// The device-local reduction kernel (`reduce.cu`) and its model here reduce the f32 family
/// only; step 1 (`checks.rs`) refuses other types' reductions with this error.
pub(crate) fn no_reduction(dtype: DType) -> CommError {
    CommError::Unsupported {
        backend: "device_local",
        what: format!("reductions of {dtype} (its kernel reduces float, bfloat16 and half)"),
    }
}

impl DeviceOps for HostOps {
    type Event = ();

    unsafe fn copy(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        // SAFETY: forwarded from the caller's contract (S3, S4 of `mod.rs`).
        unsafe { std::ptr::copy_nonoverlapping(ptr(src).cast_const(), ptr(dst), bytes) };
        Ok(())
    }

    unsafe fn reduce_in_rank_order(
        &self,
        dtype: DType,
        op: ReduceOp,
        dst: u64,
        srcs: &[u64],
        elems: usize,
    ) -> Result<()> {
        // SAFETY: forwarded from the caller's contract; the type matches `dtype`.
        unsafe {
            match dtype {
                DType::F32 => reduce_elements::<f32>(op, dst, srcs, elems),
                DType::Bf16 => reduce_elements::<half::bf16>(op, dst, srcs, elems),
                DType::F16 => reduce_elements::<half::f16>(op, dst, srcs, elems),
                DType::I32 | DType::I64 | DType::F64 => return Err(no_reduction(dtype)),
            }
        }
        Ok(())
    }

    fn record(&self) -> Result<()> {
        Ok(())
    }

    fn wait(&self, _event: &()) -> Result<()> {
        Ok(())
    }

    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
}
