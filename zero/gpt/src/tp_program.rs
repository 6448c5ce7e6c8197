//! A split GPT micro-step as plain data, for one rank of a tensor-parallel group (see
//! `model::split`): the model's split calls in order, the group's all-reduces between them
//! as operations of their own ([`TpOp::AllReduce`]: the sum, over the group, of the buffer
//! [`Gpt::tp_partial`](crate::Gpt::tp_partial) hands out), and each call's units read and
//! written in the rank's layout. What an engine derives its program from, as from
//! [`GptOp`](crate::GptOp) for whole blocks.
//!
//! Legend: L layers, T the tensor-parallel size.

use crate::layout::ParamLayout;
use crate::program::{checkpoint_segment, is_recomputed, kept_segment};

/// The three calls of a split block's forward (and of its recompute).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BlockPart {
    /// [`Gpt::tp_attention_forward`](crate::Gpt::tp_attention_forward).
    Attention,
    /// [`Gpt::tp_mlp_forward`](crate::Gpt::tp_mlp_forward).
    Mlp,
    /// [`Gpt::tp_block_output`](crate::Gpt::tp_block_output).
    Output,
}

/// One operation of a split GPT pass on one rank: a model call, named after the
/// [`Gpt`](crate::Gpt) method it runs, or the group's all-reduce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TpOp {
    /// [`Gpt::embed_forward`](crate::Gpt::embed_forward) (the embedding whole).
    Embed,
    /// [`Gpt::tp_embed_forward`](crate::Gpt::tp_embed_forward) (the vocabulary split).
    EmbedSlice,
    /// A part of block `layer`'s forward.
    Block(usize, BlockPart),
    /// A part of block `layer`'s recompute, in backward (checkpointing).
    Recompute(usize, BlockPart),
    /// [`Gpt::head_forward`](crate::Gpt::head_forward) with targets (the head whole).
    Head,
    /// [`Gpt::tp_head_forward`](crate::Gpt::tp_head_forward).
    HeadSlice,
    /// [`Gpt::tp_head_loss`](crate::Gpt::tp_head_loss).
    HeadLoss,
    /// [`Gpt::head_backward`](crate::Gpt::head_backward) (the head whole).
    HeadBackward,
    /// [`Gpt::tp_head_backward_input`](crate::Gpt::tp_head_backward_input).
    HeadSliceBackwardInput,
    /// [`Gpt::tp_head_backward_rest`](crate::Gpt::tp_head_backward_rest).
    HeadSliceBackwardRest,
    /// [`Gpt::tp_mlp_backward`](crate::Gpt::tp_mlp_backward) of a layer.
    MlpBackward(usize),
    /// [`Gpt::tp_attention_backward`](crate::Gpt::tp_attention_backward) of a layer.
    AttentionBackward(usize),
    /// [`Gpt::tp_block_input_grad`](crate::Gpt::tp_block_input_grad) of a layer.
    BlockInputGrad(usize),
    /// [`Gpt::embed_backward`](crate::Gpt::embed_backward) (the embedding whole).
    EmbedBackward,
    /// [`Gpt::tp_embed_backward`](crate::Gpt::tp_embed_backward).
    EmbedSliceBackward,
    /// The sum over the tensor-parallel group, in place, of the buffer
    /// [`Gpt::tp_partial`](crate::Gpt::tp_partial) hands out after the previous call.
    AllReduce,
}

impl TpOp {
    /// The units whose parameters the operation reads, in the rank's `layout`
    /// ([`ParamLayout::split`] or [`ParamLayout::split_vocab`]): an attention call its
    /// block's attention slice and replicated unit, an MLP call its MLP slice and replicated
    /// unit, so that a stage-3 engine gathers one slice at a time.
    #[must_use]
    pub fn reads(self, layout: &ParamLayout) -> Vec<usize> {
        let last = layout.final_norm_unit();
        match self {
            Self::Embed | Self::HeadSliceBackwardInput => vec![0],
            Self::EmbedSlice => vec![0, positions(layout)],
            Self::Block(l, BlockPart::Attention)
            | Self::Recompute(l, BlockPart::Attention)
            | Self::AttentionBackward(l) => attention_units(l).to_vec(),
            Self::Block(l, BlockPart::Mlp)
            | Self::Recompute(l, BlockPart::Mlp)
            | Self::MlpBackward(l) => mlp_units(l).to_vec(),
            Self::BlockInputGrad(l) => vec![ParamLayout::replicated_unit(l)],
            Self::Head | Self::HeadSlice | Self::HeadBackward => vec![last, 0],
            Self::HeadSliceBackwardRest => vec![last],
            Self::Block(_, BlockPart::Output)
            | Self::Recompute(_, BlockPart::Output)
            | Self::HeadLoss
            | Self::EmbedBackward
            | Self::EmbedSliceBackward
            | Self::AllReduce => Vec::new(),
        }
    }

    /// The units whose gradients the operation adds into, in the rank's `layout`.
    #[must_use]
    pub fn writes(self, layout: &ParamLayout) -> Vec<usize> {
        let last = layout.final_norm_unit();
        match self {
            Self::HeadBackward | Self::HeadSliceBackwardRest => vec![last, 0],
            Self::MlpBackward(l) => mlp_units(l).to_vec(),
            Self::AttentionBackward(l) => attention_units(l).to_vec(),
            Self::BlockInputGrad(l) => vec![ParamLayout::replicated_unit(l)],
            Self::EmbedBackward => vec![0],
            Self::EmbedSliceBackward => vec![0, positions(layout)],
            _ => Vec::new(),
        }
    }

    /// The kept input the operation keeps (the caller's store: [`Gpt::keep_input`] after
    /// it), with checkpointing every `every` blocks of `layers`: a recomputed segment's, by
    /// its first block's output.
    ///
    /// [`Gpt::keep_input`]: crate::Gpt::keep_input
    #[must_use]
    pub fn keeps(self, layers: usize, every: Option<usize>) -> Option<usize> {
        match self {
            Self::Block(l, BlockPart::Output) => kept_segment(l, layers, every),
            _ => None,
        }
    }

    /// The kept input the operation restores ([`Gpt::restore_input`] before it): a
    /// recomputed segment's, by its first block's recompute.
    ///
    /// [`Gpt::restore_input`]: crate::Gpt::restore_input
    #[must_use]
    pub fn restores(self, layers: usize, every: Option<usize>) -> Option<usize> {
        match self {
            Self::Recompute(l, BlockPart::Attention) => kept_segment(l, layers, every),
            _ => None,
        }
    }
}

/// The units of block `layer`'s attention calls: (its attention slice, its replicated unit).
pub(crate) fn attention_units(layer: usize) -> [usize; 2] {
    let [attention, _, replicated] = ParamLayout::split_block_units(layer);
    [attention, replicated]
}

/// The units of block `layer`'s MLP calls: (its MLP slice, its replicated unit).
pub(crate) fn mlp_units(layer: usize) -> [usize; 2] {
    let [_, mlp, replicated] = ParamLayout::split_block_units(layer);
    [mlp, replicated]
}

/// The unit of `wpe` in a vocabulary-split layout (unit 0 otherwise, where it lies).
fn positions(layout: &ParamLayout) -> usize {
    layout.positions_unit().unwrap_or(0)
}

/// One block's forward (or recompute, `as_op` [`TpOp::Recompute`]) with its two
/// all-reduces.
fn block_ops(layer: usize, as_op: fn(usize, BlockPart) -> TpOp) -> [TpOp; 5] {
    [
        as_op(layer, BlockPart::Attention),
        TpOp::AllReduce,
        as_op(layer, BlockPart::Mlp),
        TpOp::AllReduce,
        as_op(layer, BlockPart::Output),
    ]
}

/// One training micro-step of a rank of a group that splits the blocks of a model of
/// `layers` layers (and its vocabulary, with `vocab`), checkpointing every `every` blocks
/// or none: the same order as [`train_ops`](crate::train_ops), each split call followed by
/// its all-reduce where one is due (4 per block, 2 more per recomputed block, 3 more with
/// the vocabulary split).
#[must_use]
pub fn tp_train_ops(layers: usize, every: Option<usize>, vocab: bool) -> Vec<TpOp> {
    use TpOp::*;
    let mut ops = if vocab {
        vec![EmbedSlice, AllReduce]
    } else {
        vec![Embed]
    };
    for layer in 0..layers {
        ops.extend(block_ops(layer, Block));
    }
    if vocab {
        ops.extend([HeadSlice, AllReduce, HeadLoss]);
        ops.extend([HeadSliceBackwardInput, AllReduce, HeadSliceBackwardRest]);
    } else {
        ops.extend([Head, HeadBackward]);
    }
    for layer in (0..layers).rev() {
        let segment = checkpoint_segment(layer, layers, every);
        if layer + 1 == segment.end && is_recomputed(layer, layers, every) {
            for r in segment {
                ops.extend(block_ops(r, Recompute));
            }
        }
        ops.extend([
            MlpBackward(layer),
            AllReduce,
            AttentionBackward(layer),
            AllReduce,
        ]);
        ops.push(BlockInputGrad(layer));
    }
    ops.push(if vocab {
        EmbedSliceBackward
    } else {
        EmbedBackward
    });
    ops
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_has_four_reductions_per_block_and_two_per_recomputed_block() {
        let count = |ops: &[TpOp]| ops.iter().filter(|o| **o == TpOp::AllReduce).count();
        assert_eq!(count(&tp_train_ops(3, None, false)), 12);
        assert_eq!(count(&tp_train_ops(3, None, true)), 15);
        // Every 2 of 3: blocks 0 and 1 are recomputed.
        assert_eq!(count(&tp_train_ops(3, Some(2), false)), 16);
        let keeps: Vec<_> = (0..3)
            .map(|l| TpOp::Block(l, BlockPart::Output).keeps(3, Some(1)))
            .collect();
        assert_eq!(keeps, [Some(0), Some(1), None]);
        let restore = TpOp::Recompute(1, BlockPart::Attention).restores(3, Some(1));
        assert_eq!(restore, Some(1));
    }
}
