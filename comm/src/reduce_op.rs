//! Reductions (sum, avg, max, min) and the block kernel every backend on the CPU shares.
//!
//! Inputs are combined in the order given (rank 0, 1, ..., N-1) in the type's accumulator
//! (f32 for f32 and the halves, else the type itself; see `element.rs`) and the result is
//! rounded once: so a reduction is bitwise reproducible whatever the timing, and a
//! half-precision sum loses no more than one rounding. Integer sums wrap.

use crate::dtype::DType;
use crate::element::{Accumulator, Element};
use crate::error::{CommError, Result};
use crate::op::OpKind;

/// A reduction operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum of the inputs (wrapping around for integers, as NCCL and MPI do).
    Sum,
    /// Sum divided by the number of inputs (in the accumulator, before the final rounding).
    /// Floating-point types only: see [`ReduceOp::supports`].
    Avg,
    /// Largest input (floats: `f32::max` semantics, a NaN input is ignored unless all are
    /// NaN).
    Max,
    /// Smallest input (floats: `f32::min` semantics).
    Min,
}

impl ReduceOp {
    /// Every operator, in declaration order (their wire codes are their indices here).
    pub const ALL: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min];

    /// The nccl-tests name (`sum`, `avg`, `max`, `min`).
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Avg => "avg",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
        }
    }

    /// Parses an nccl-tests name.
    pub fn parse(s: &str) -> Option<ReduceOp> {
        match s {
            "sum" => Some(ReduceOp::Sum),
            "avg" => Some(ReduceOp::Avg),
            "max" => Some(ReduceOp::Max),
            "min" => Some(ReduceOp::Min),
            _ => None,
        }
    }

    /// Whether this reduction is defined on `dtype`: every one is, except avg on the integer
    /// types, which every collective refuses with [`CommError::UnsupportedReduction`] (an
    /// integer mean needs a rounding rule; sum, then divide as the caller sees fit).
    pub const fn supports(self, dtype: DType) -> bool {
        !(matches!(self, ReduceOp::Avg) && dtype.is_integer())
    }

    /// [`CommError::UnsupportedReduction`] unless [`ReduceOp::supports`] `dtype`.
    pub(crate) fn check(self, op: OpKind, dtype: DType) -> Result<()> {
        if self.supports(dtype) {
            Ok(())
        } else {
            Err(CommError::UnsupportedReduction {
                op,
                redop: self,
                dtype,
            })
        }
    }

    /// `acc = op(widen(a), widen(b))` element by element: the first two inputs in one pass.
    /// Generic over the widening so the f32 and bf16 paths compile to one fused,
    /// vectorised loop with no staging buffer.
    #[inline(always)]
    pub(crate) fn combine2_with<S: Copy, A: Accumulator>(
        self,
        acc: &mut [A],
        a: &[S],
        b: &[S],
        widen: impl Fn(S) -> A,
    ) {
        let it = acc.iter_mut().zip(a.iter().zip(b));
        match self {
            ReduceOp::Sum | ReduceOp::Avg => {
                it.for_each(|(o, (x, y))| *o = widen(*x).add(widen(*y)));
            }
            ReduceOp::Max => it.for_each(|(o, (x, y))| *o = widen(*x).max(widen(*y))),
            ReduceOp::Min => it.for_each(|(o, (x, y))| *o = widen(*x).min(widen(*y))),
        }
    }

    /// Combines `src` (widened by `widen`) into the accumulator `acc`, element by element.
    #[inline(always)]
    pub(crate) fn combine_with<S: Copy, A: Accumulator>(
        self,
        acc: &mut [A],
        src: &[S],
        widen: impl Fn(S) -> A,
    ) {
        let pairs = acc.iter_mut().zip(src);
        match self {
            ReduceOp::Sum | ReduceOp::Avg => pairs.for_each(|(a, s)| *a = a.add(widen(*s))),
            ReduceOp::Max => pairs.for_each(|(a, s)| *a = a.max(widen(*s))),
            ReduceOp::Min => pairs.for_each(|(a, s)| *a = a.min(widen(*s))),
        }
    }
}

impl std::fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Elements per block: the two accumulator blocks (8 KiB each in f32, 16 KiB for 8-byte
/// types) stay in L1 while the inputs stream.
const BLOCK: usize = 2048;

/// Reduces `inputs` (all of length `len`) into `out`, combining in slice order.
///
/// `op` must support `T` ([`ReduceOp::supports`]; callers check it where they validate the
/// call).
///
/// # Safety
/// Every pointer in `inputs` must be valid for reads of `len` elements and `out` valid for
/// writes of `len` elements for the duration of the call, and no other thread may write any of
/// these ranges meanwhile. `out` may equal one of the inputs (in-place): each block is read in
/// full before it is written.
pub(crate) unsafe fn reduce_raw<T: Element>(
    out: *mut T,
    inputs: &[*const T],
    len: usize,
    op: ReduceOp,
) {
    if let [only] = inputs {
        // One input: every op is the identity on it (a sum of one, an average divided by 1,
        // both exact), so the result is the input itself: nothing to do in place, a copy
        // otherwise. This is a single rank's every reduction.
        if !std::ptr::eq(*only, out.cast_const()) {
            // SAFETY: the caller guarantees `only` readable and `out` writable for `len`
            // elements and no other writer; `copy` allows the two ranges to overlap.
            unsafe { std::ptr::copy(*only, out, len) };
        }
        return;
    }
    let mut acc = [T::Acc::default(); BLOCK];
    let mut tmp = [T::Acc::default(); BLOCK];
    let mut start = 0;
    while start < len {
        let n = BLOCK.min(len - start);
        let block = |p: *const T| {
            // SAFETY: the caller guarantees every input is readable for `len` elements and
            // unwritten by others; `start + n <= len`. The slices die before `out` is
            // written below.
            unsafe { std::slice::from_raw_parts(p.add(start), n) }
        };
        match inputs {
            [a, b, rest @ ..] => {
                T::accumulate2(&mut acc[..n], block(*a), block(*b), &mut tmp[..n], op);
                for &p in rest {
                    T::accumulate(&mut acc[..n], block(p), &mut tmp[..n], op);
                }
            }
            [a] => T::widen_block(block(*a), &mut acc[..n]),
            [] => acc[..n].fill(T::Acc::default()),
        }
        if op == ReduceOp::Avg {
            // A division, not a multiply by 1/N, so avg rounds exactly like sum/N would.
            let count = inputs.len();
            acc[..n].iter_mut().for_each(|a| *a = a.div_count(count));
        }
        // SAFETY: `out` is writable for `len` elements and no reference into this block is
        // alive (input slices above were dropped).
        let dst = unsafe { std::slice::from_raw_parts_mut(out.add(start), n) };
        T::narrow_block(&acc[..n], dst);
        start += n;
    }
}

/// The block reduction over slices: the reference semantics of every backend (accumulation
/// in input order, one rounding; see the module docs).
///
/// # Panics
/// If `inputs` is empty, an input's length differs from `out`'s, or `op` does not support
/// `T` (avg on an integer type).
pub fn reduce_slices<T: Element>(out: &mut [T], inputs: &[&[T]], op: ReduceOp) {
    let len = out.len();
    assert!(
        !inputs.is_empty() && inputs.iter().all(|s| s.len() == len),
        "reduce_slices: need at least one input, each of the output's length"
    );
    assert!(op.supports(T::DTYPE), "reduce_slices: {op} on {}", T::DTYPE);
    let ptrs: Vec<*const T> = inputs.iter().map(|s| s.as_ptr()).collect();
    // SAFETY: lengths checked above; the borrow checker forbids `out` aliasing an input.
    unsafe { reduce_raw(out.as_mut_ptr(), &ptrs, len, op) };
}
