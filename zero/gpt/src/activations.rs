//! Activation buffers: one flat forward buffer carved by a (B, T)-dependent size table, and one
//! backward scratch buffer reused by every layer.
//!
//! Legend: B batch, T sequence, C channels, NH heads, L layers, N = B*T, Vp padded vocabulary.
//!
//! The forward buffer is laid out unit by unit, `[embed | layer 0 | .. | layer L-1 | head]`,
//! so one layer's activations are contiguous. Each region ends with its output (N,C), so a
//! block's input is always the last N*C elements before its region. With activation
//! checkpointing every K blocks, only K regions exist, reused segment after segment.
//!
//! For one rank of a tensor-parallel group of T (`Gpt::with_tensor_parallel`), the views of
//! its heads and MLP columns (qkv, atty, att, fch, fch_gelu and their gradients) are T times
//! smaller and every (N,C) view whole; with the vocabulary split too, the logits view holds
//! this rank's (N,Vp/T) logits followed by its (N,T+1) loss statistics.

use super::backend::{Backend, CpuBackend, View};
use super::config::GptConfig;
use super::error::{GptError, Result};
use super::views::{sub, sub_mut};
use std::fmt;
use std::ops::Range;

mod build;
mod kept;
mod sizes;

pub use kept::KeptBy;
pub(crate) use kept::{check_call as check_kept_call, Kept};
pub(crate) use sizes::Sizes;
pub use sizes::{activation_buffers, activation_bytes, BACKEND_SCRATCH, BUFFER_NAMES, KEPT_INPUTS};

/// Names of a layer region's views, in buffer order (the output `res3` last).
pub const LAYER_VIEWS: [&str; 15] = [
    "ln1", "ln1_mean", "ln1_rstd", "qkv", "atty", "att", "attproj", "res2", "ln2", "ln2_mean",
    "ln2_rstd", "fch", "fch_gelu", "fcproj", "res3",
];

/// Names of the head region's views, in buffer order.
pub const HEAD_VIEWS: [&str; 5] = ["lnf", "lnf_mean", "lnf_rstd", "logits", "losses"];

/// Names of the backward scratch views, in buffer order.
pub const GRAD_VIEWS: [&str; 6] = ["dres", "dln", "datty", "dqkv", "dfch", "dfch_gelu"];

/// Where a forward/backward sequence stands; each unit call checks it, so a call out of order
/// is an error instead of a gradient computed from stale activations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Progress {
    /// Nothing run yet since allocation.
    Empty,
    /// Forward ran up to (not including) unit `next`.
    Forward { next: usize },
    /// The head ran without targets: logits are valid, no loss, no backward possible.
    Logits,
    /// The head ran with targets: the loss is valid and backward may start.
    Loss,
    /// The head's backward to its input ran; the tied weight's gradient is due.
    HeadWeight,
    /// Backward ran down to unit `next + 1`; unit `next` is due.
    Backward { next: usize },
    /// Backward finished.
    Done,
    /// Split over a tensor-parallel group: block `layer`'s split pass (or, vocabulary split,
    /// the embedding's, layer 0, or the head's, layer L) has run up to `done`.
    Split { layer: usize, done: SplitStep },
}

/// The steps of a block split over a tensor-parallel group, in the order they run: each
/// compute call, then its collective (the model hands out the buffer the collective runs
/// on, [`crate::Gpt::tp_partial`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SplitStep {
    /// Forward: the attention's partial output (N,C) of this rank's heads.
    AttentionPartial,
    /// Forward: that output handed out to be summed over the group.
    AttentionReduced,
    /// Forward: the MLP's partial output (N,C) of this rank's columns.
    MlpPartial,
    /// Forward: that output handed out to be summed over the group.
    MlpReduced,
    /// Backward: this rank's part of d(ln2's output).
    MlpGradPartial,
    /// Backward: that gradient handed out to be summed over the group.
    MlpGradReduced,
    /// Backward: this rank's part of d(ln1's output).
    AttentionGradPartial,
    /// Backward: that gradient handed out to be summed over the group.
    AttentionGradReduced,
    /// Vocabulary split, forward: this rank's part of the embedding (N,C) (layer 0); once
    /// handed out, block 0 is due.
    EmbedPartial,
    /// Vocabulary split, forward: this rank's loss statistics (N,T+1) (layer L).
    LossStatsPartial,
    /// Those handed out to be summed over the group.
    LossStatsReduced,
    /// Vocabulary split, backward: this rank's part of d(lnf) (N,C) (layer L).
    HeadGradPartial,
    /// That gradient handed out to be summed over the group.
    HeadGradReduced,
}

impl SplitStep {
    /// True for the backward steps.
    pub(crate) fn is_backward(self) -> bool {
        matches!(
            self,
            Self::MlpGradPartial
                | Self::MlpGradReduced
                | Self::AttentionGradPartial
                | Self::AttentionGradReduced
                | Self::HeadGradPartial
                | Self::HeadGradReduced
        )
    }

    /// The progress once a partial step's buffer of layer `layer` was handed out (its
    /// reduced twin), or `None` when no collective is due after this step.
    pub(crate) fn after_reduction(self, layer: usize) -> Option<Progress> {
        let done = match self {
            Self::AttentionPartial => Self::AttentionReduced,
            Self::MlpPartial => Self::MlpReduced,
            Self::MlpGradPartial => Self::MlpGradReduced,
            Self::AttentionGradPartial => Self::AttentionGradReduced,
            Self::LossStatsPartial => Self::LossStatsReduced,
            Self::HeadGradPartial => Self::HeadGradReduced,
            Self::EmbedPartial => return Some(Progress::Forward { next: 1 }),
            _ => return None,
        };
        Some(Progress::Split { layer, done })
    }
}

/// Memory an activation buffer lives in, viewed as `S` (a backend's `Slice`): on CPU a
/// `Vec<f32>` by default, or any other owner of f32 memory the caller hands over, such as a
/// block lent out of a rank's arena (zero-train does that, so the engine's arena holds, caps
/// and counts the activations while this crate knows no allocator); on a device, device
/// memory ([`Backend::alloc`]).
pub trait ActivationMemory<S: ?Sized = [f32]>: Send + fmt::Debug {
    /// The memory, read.
    fn floats(&self) -> &S;
    /// The memory, written.
    fn floats_mut(&mut self) -> &mut S;
}

impl<M: AsRef<[f32]> + AsMut<[f32]> + Send + fmt::Debug> ActivationMemory for M {
    fn floats(&self) -> &[f32] {
        self.as_ref()
    }
    fn floats_mut(&mut self) -> &mut [f32] {
        self.as_mut()
    }
}

/// An activation buffer of a backend whose views are `S` (host memory by default).
pub type Buffer<S = [f32]> = Box<dyn ActivationMemory<S>>;

/// Activations of one (B, T) batch shape, in backend `B`'s memory.
///
/// With activation checkpointing every K blocks, the forward buffer holds K layer regions
/// (one segment) instead of L: the input of every K-th block is kept ([`KeptBy`]) as the
/// forward passes it, and before a segment's backward its blocks are run forward again from
/// that copy ([`crate::Gpt::block_recompute`]). The last segment's activations are still in
/// place when backward starts, so it is never recomputed.
pub struct Activations<B: Backend = CpuBackend> {
    pub(crate) b: usize,
    pub(crate) t: usize,
    pub(crate) c: usize,
    /// The model these buffers were sized for; every unit call checks it.
    pub(crate) config: GptConfig,
    /// The tensor-parallel size they were sized for (1: whole blocks); checked likewise.
    pub(crate) tp: usize,
    /// Whether they were sized for a split vocabulary (logits (N,Vp/T) and statistics).
    pub(crate) vocab_parallel: bool,
    /// Forward buffer: `[input (N,C) | slots x layer region | head region]`; block `l` uses
    /// region `l % slots`.
    pub(crate) fwd: Buffer<B::Slice>,
    /// Kept block inputs with checkpointing: S x (N,C), one per segment (none without).
    pub(crate) kept: Kept<B>,
    /// Backward scratch: `[dres (N,C) | dln (N,C) | datty (N,C) | dqkv (N,3C) | dfch (N,4C) |
    /// dfch_gelu (N,4C)]`.
    pub(crate) grad: Buffer<B::Slice>,
    pub(crate) layer_lens: [usize; 15],
    pub(crate) head_lens: [usize; 5],
    pub(crate) grad_lens: [usize; 6],
    /// Blocks per checkpointed segment (`None`: no checkpointing).
    pub(crate) every: Option<usize>,
    pub(crate) slots: usize,
    /// The segment whose activations the layer regions hold now (checkpointing only).
    pub(crate) valid_segment: Option<usize>,
    /// The next block a segment's recompute runs.
    pub(crate) recompute_next: Option<usize>,
    /// Split blocks: the block running now is a recompute (its output returns to backward).
    pub(crate) recomputing: bool,
    pub(crate) dlosses: Buffer<B::Slice>, // (B,T), 1/N each: d(mean loss)/d(loss[b,t])
    pub(crate) tokens: Buffer<B::Slice>,  // (B,T) u32 ids, viewed by `B::ids`
    pub(crate) targets: Buffer<B::Slice>, // (B,T) u32 ids, viewed by `B::ids`
    pub(crate) progress: Progress,
}

impl<B: Backend> fmt::Debug for Activations<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Activations")
            .field("b", &self.b)
            .field("t", &self.t)
            .field("every", &self.every)
            .field("progress", &self.progress)
            .finish_non_exhaustive()
    }
}

impl<B: Backend> Activations<B> {
    /// B.
    #[must_use]
    pub fn batch(&self) -> usize {
        self.b
    }

    /// T.
    #[must_use]
    pub fn seq_len(&self) -> usize {
        self.t
    }

    /// Bytes held by every buffer (forward, backward scratch, tokens, targets, loss
    /// gradients) and by the kept inputs when the activations keep them, counted from the
    /// buffers themselves.
    #[must_use]
    pub fn bytes(&self) -> u64 {
        let bufs = [
            &self.fwd,
            &self.grad,
            &self.dlosses,
            &self.tokens,
            &self.targets,
        ];
        4 * bufs.iter().map(|b| b.floats().len()).sum::<usize>() as u64 + self.kept.resident_bytes()
    }

    /// Blocks per checkpointed segment, or `None` without checkpointing.
    #[must_use]
    pub fn checkpoint_every(&self) -> Option<usize> {
        self.every
    }

    /// The blocks of `layer`'s checkpointed segment (just `layer` without checkpointing).
    #[must_use]
    pub fn segment(&self, layer: usize) -> Range<usize> {
        crate::program::checkpoint_segment(layer, self.config.num_layers, self.every)
    }

    /// True when `layer`'s activations must be recomputed before its backward: its
    /// segment's forward was dropped (checkpointing only).
    #[must_use]
    pub fn needs_recompute(&self, layer: usize) -> bool {
        self.every.is_some() && self.valid_segment != Some(self.segment(layer).start)
    }

    /// Per-position losses (B,T) of the last head forward with targets.
    ///
    /// # Errors
    /// [`GptError::OutOfOrder`] before a loss was computed.
    pub fn losses(&self) -> Result<&B::Slice> {
        let in_backward = match self.progress {
            Progress::Loss | Progress::HeadWeight | Progress::Backward { .. } | Progress::Done => {
                true
            }
            Progress::Split { done, .. } => done.is_backward(),
            _ => false,
        };
        if !in_backward {
            return Err(GptError::OutOfOrder {
                call: "losses",
                reason: "no head forward with targets since the last embed forward".into(),
            });
        }
        let n = self.b * self.t;
        let fwd = self.fwd.floats();
        Ok(sub(fwd, fwd.len() - n..fwd.len()))
    }

    pub(crate) fn layer_len(&self) -> usize {
        self.layer_lens.iter().sum()
    }

    /// Offset in `fwd` of the region block `l` uses; its input is the N*C elements before.
    pub(crate) fn layer_offset(&self, l: usize) -> usize {
        self.b * self.t * self.c + (l % self.slots) * self.layer_len()
    }

    /// Offset in `fwd` of the head's input (N,C): the last block's output.
    pub(crate) fn head_input_offset(&self) -> usize {
        let last = self.config.num_layers - 1;
        self.layer_offset(last) + self.layer_len() - self.b * self.t * self.c
    }

    /// Offset of the head region in `fwd`.
    pub(crate) fn head_offset(&self) -> usize {
        self.fwd.floats().len() - self.head_lens.iter().sum::<usize>()
    }

    /// Checkpointing, before the first block `layer` of a segment runs forward: moves the
    /// previous block's output (in the last region) into the input slot and keeps it (the
    /// caller's store takes it after the block, [`crate::Gpt::keep_input`]).
    pub(crate) fn begin_segment(&mut self, backend: &B, layer: usize) -> Result<()> {
        let nc = self.b * self.t * self.c;
        if layer > 0 {
            // The previous output lies past the input slot (every region is at least N*C).
            let from = self.layer_offset(layer - 1) + self.layer_len() - nc;
            let (input, rest) = self.fwd.floats_mut().split_at_mut(nc);
            backend.copy(input, sub(rest, from - nc..from));
        }
        let segment = self.segment_index(layer);
        self.kept
            .keep(backend, segment, sub(self.fwd.floats(), 0..nc))
    }

    /// Checkpointing, before recomputing the segment that starts at `layer`: puts its kept
    /// input back in the input slot (the caller's store has put it there already).
    pub(crate) fn restore_segment(&mut self, backend: &B, layer: usize) -> Result<()> {
        let nc = self.b * self.t * self.c;
        let segment = self.segment_index(layer);
        self.kept
            .restore(backend, segment, sub_mut(self.fwd.floats_mut(), 0..nc))
    }

    pub(crate) fn segment_index(&self, layer: usize) -> usize {
        layer / self.every.unwrap_or(1)
    }
}
