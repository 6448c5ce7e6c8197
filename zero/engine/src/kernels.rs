//! The arithmetic the engine does on model states, behind one trait, so that it runs where
//! the arena's memory is.
//!
//! The engine's passes (gather, backward, step, initialisation) never compute on model-state
//! bytes themselves: they name arena blocks and ranges ([`Span`]s) and call a [`Kernels`]
//! implementation. [`HostKernels`] computes on host arenas; an implementation for a device
//! arena launches kernels on the blocks' device addresses instead.
//!
//! Decision: an object-safe trait whose methods take the element type as a [`DType`] value,
//! held by the engine as `Box<dyn Kernels>`, so `Engine` stays one type and a trainer picks
//! the implementation at run time. Rejected: a type parameter `Engine<K>`, which every impl
//! block, the in-flight queues and every caller would carry for one virtual call per unit.
//!
//! Every method states its contract as the host implementation computes it; the host
//! implementation is the reference a device implementation is tested against.
//!
//! Collectives over model states go through the sibling trait
//! [`Collectives`](crate::Collectives). Not behind either: checkpoint export and import, and
//! the views a model reads ([`OpUnits::params`](crate::OpUnits::params),
//! [`OpUnits::views`](crate::OpUnits::views)), which are host slices (a model on a device
//! arena reads `OpUnits::device_param` and `OpUnits::device_views`, built with the `cuda`
//! feature, instead).

#[cfg(feature = "cuda")]
pub mod cuda;
mod host;
mod split;

use std::fmt::Debug;
use std::ops::Range;

use zero_alloc::{Arena, Handle};
use zero_comm::DType;

use crate::error::{Error, Result};
use crate::optim::{AdamW, DecaySegment};

#[cfg(feature = "cuda")]
pub use cuda::CudaKernels;
pub use host::HostKernels;

/// A range of an arena block, in elements of the type the call names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    /// The block.
    pub block: Handle,
    /// First element.
    pub start: usize,
    /// Elements.
    pub len: usize,
}

impl Span {
    /// Elements `range` of `block`.
    pub fn new(block: Handle, range: Range<usize>) -> Self {
        Self {
            block,
            start: range.start,
            len: range.end.saturating_sub(range.start),
        }
    }

    /// The element range within the block.
    pub fn range(&self) -> Range<usize> {
        self.start..self.start.saturating_add(self.len)
    }
}

/// `span`'s elements of a block's view, or [`Error::BadSpan`] naming `what` failed.
pub(crate) fn part<'a, T>(what: &'static str, block: &'a [T], span: Span) -> Result<&'a [T]> {
    let len = block.len();
    block
        .get(span.range())
        .ok_or_else(|| outside(what, span, len))
}

/// As [`part`], mutable.
pub(crate) fn part_mut<'a, T>(
    what: &'static str,
    block: &'a mut [T],
    span: Span,
) -> Result<&'a mut [T]> {
    let len = block.len();
    block
        .get_mut(span.range())
        .ok_or_else(|| outside(what, span, len))
}

fn outside(what: &'static str, span: Span, len: usize) -> Error {
    Error::BadSpan {
        kernel: what,
        message: format!(
            "elements {}..{} of a block of {len}",
            span.start,
            span.start.saturating_add(span.len)
        ),
    }
}

/// The buffers of one AdamW update over the range a rank owns of one unit.
#[derive(Debug, Clone, Copy)]
pub struct AdamWBuffers {
    /// Reduced gradients, in the storage type.
    pub grads: Span,
    /// f32 scratch as long as `grads`: the gradients as the update reads them.
    pub scratch: Span,
    /// f32 master weights (half precision); `None` when `params` are f32 and the master copy.
    pub master: Option<Span>,
    /// Stored parameters (storage type), as long as `grads`.
    pub params: Span,
    /// First moment (f32).
    pub m: Span,
    /// Second moment (f32).
    pub v: Span,
}

/// The scalars of one AdamW update.
#[derive(Debug, Clone, Copy)]
pub struct AdamWStep<'a> {
    /// Hyper-parameters.
    pub adam: AdamW,
    /// Adam's step count, from 1.
    pub t: u64,
    /// Learning rate.
    pub lr: f32,
    /// Takes stored gradients to the unscaled mean over micro-steps.
    pub grad_factor: f32,
    /// Clipping coefficient (1 when not clipped).
    pub clip_coef: f32,
    /// Where the owned range starts in unit coordinates (for `segments`).
    pub offset: usize,
    /// Weight-decay segments of the unit, in unit coordinates.
    pub segments: &'a [DecaySegment],
}

/// The element-wise passes of the engine over blocks of its arena. `dtype` is the storage
/// type of parameters and gradients; f32 buffers are named as such. Spans of one call lie in
/// distinct blocks unless the method says otherwise.
pub trait Kernels: Send + Debug {
    /// Short name for logs (`host`, `cuda`).
    fn name(&self) -> &'static str;

    /// `dst = 0`.
    ///
    /// # Errors
    /// Arena errors (stale handle, range outside the block, a block on another device).
    fn fill_zero(&self, arena: &mut Arena, dtype: DType, dst: Span) -> Result<()>;

    /// `dst[i] = src[i]` (same type, same length).
    ///
    /// # Errors
    /// As [`Kernels::fill_zero`].
    fn copy(&self, arena: &mut Arena, dtype: DType, src: Span, dst: Span) -> Result<()>;

    /// `dst[i] = f32(src[i]) * factor`, `dst` f32, the multiplication skipped when `factor`
    /// is 1.
    ///
    /// # Errors
    /// As [`Kernels::fill_zero`].
    fn widen(
        &self,
        arena: &mut Arena,
        dtype: DType,
        src: Span,
        dst: Span,
        factor: f32,
    ) -> Result<()>;

    /// `dst[i] = round(src[i] * factor)` from f32 `src`, round to nearest even, the
    /// multiplication skipped when `factor` is 1.
    ///
    /// # Errors
    /// As [`Kernels::fill_zero`].
    fn narrow(
        &self,
        arena: &mut Arena,
        dtype: DType,
        src: Span,
        dst: Span,
        factor: f32,
    ) -> Result<()>;

    /// `acc[i] = round(f32(acc[i]) + f32(x[i]))`, noting for [`Kernels::take_overflow`]
    /// whether any stored `acc[i]` is inf or NaN (an inf or NaN `x[i]`, or a sum past the
    /// storage type's range). Nothing waits for the note: on a device it stays there until
    /// taken.
    ///
    /// # Errors
    /// As [`Kernels::fill_zero`].
    fn accumulate(&self, arena: &mut Arena, dtype: DType, acc: Span, x: Span) -> Result<()>;

    /// Whether any [`Kernels::accumulate`] since the last call saw an inf or NaN; clears the
    /// note. On a device this waits for the work queued before it, so the engine asks once a
    /// step and only where the answer is used (fp16's loss scaling).
    ///
    /// # Errors
    /// As [`Kernels::fill_zero`].
    fn take_overflow(&self, arena: &mut Arena) -> Result<bool>;

    /// `sum + Σ f64(f32(src[i]) * factor)^2`, added in index order in f64.
    ///
    /// # Errors
    /// As [`Kernels::fill_zero`].
    fn add_squares(
        &self,
        arena: &mut Arena,
        dtype: DType,
        src: Span,
        factor: f32,
        sum: f64,
    ) -> Result<f64>;

    /// One AdamW update: `scratch = f32(grads) * grad_factor * clip_coef` (in that order),
    /// [`AdamW::update`] of the master weights (or of f32 `params`) with `m` and `v` over the
    /// unit's decay segments, then `params = round(master)` for half precision. `grads` are
    /// left as they were.
    ///
    /// # Errors
    /// As [`Kernels::fill_zero`], and [`AdamW::update`]'s errors.
    fn adamw(
        &self,
        arena: &mut Arena,
        dtype: DType,
        bufs: &AdamWBuffers,
        step: &AdamWStep<'_>,
    ) -> Result<()>;
}
