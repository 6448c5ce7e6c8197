//! A GPT micro-step as plain data: the model calls in order, each with the units whose
//! parameters it reads and whose gradients it writes. An engine derives its gathers,
//! releases and reductions from this (zero's `Program`); the activation-checkpointing
//! segment rule lives here and nowhere else ([`checkpoint_segment`]).

use crate::layout::ParamLayout;
use std::ops::Range;

/// One model call of a GPT pass, named after the [`Gpt`](crate::Gpt) method it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GptOp {
    /// [`Gpt::embed_forward`](crate::Gpt::embed_forward).
    Embed,
    /// [`Gpt::block_forward`](crate::Gpt::block_forward) of a layer.
    Block(usize),
    /// [`Gpt::head_forward`](crate::Gpt::head_forward): the loss with targets, the logits
    /// without.
    Head,
    /// [`Gpt::head_backward_input`](crate::Gpt::head_backward_input).
    HeadBackwardInput,
    /// [`Gpt::head_backward_weight`](crate::Gpt::head_backward_weight): the LM head's part
    /// of d(wte), which needs no parameters.
    HeadBackwardWeight,
    /// [`Gpt::block_recompute`](crate::Gpt::block_recompute) of a layer (checkpointing).
    Recompute(usize),
    /// [`Gpt::block_backward`](crate::Gpt::block_backward) of a layer.
    BlockBackward(usize),
    /// [`Gpt::embed_backward`](crate::Gpt::embed_backward): the encoder's part of d(wte),
    /// and d(wpe).
    EmbedBackward,
}

impl GptOp {
    /// The units whose parameters the call reads, in a model of `layers` layers.
    pub fn reads(self, layers: usize) -> Vec<usize> {
        let final_norm = layers + 1;
        match self {
            Self::Embed => vec![0],
            Self::Block(l) | Self::Recompute(l) | Self::BlockBackward(l) => {
                vec![ParamLayout::block_unit(l)]
            }
            Self::Head | Self::HeadBackwardInput => vec![final_norm, 0],
            Self::HeadBackwardWeight | Self::EmbedBackward => Vec::new(),
        }
    }

    /// The units whose gradients the call adds into, in a model of `layers` layers.
    pub fn writes(self, layers: usize) -> Vec<usize> {
        match self {
            Self::HeadBackwardInput => vec![layers + 1],
            Self::HeadBackwardWeight | Self::EmbedBackward => vec![0],
            Self::BlockBackward(l) => vec![ParamLayout::block_unit(l)],
            Self::Embed | Self::Block(_) | Self::Head | Self::Recompute(_) => Vec::new(),
        }
    }
}

impl GptOp {
    /// The kept input the call keeps, with checkpointing every `every` blocks in a model of
    /// `layers` layers: a recomputed segment's index, by the segment's first block
    /// ([`crate::Gpt::keep_input`] after its forward).
    pub fn keeps(self, layers: usize, every: Option<usize>) -> Option<usize> {
        match self {
            Self::Block(l) => kept_segment(l, layers, every),
            _ => None,
        }
    }

    /// The kept input the call restores: a recomputed segment's, by its first block's
    /// recompute ([`crate::Gpt::restore_input`] before it).
    pub fn restores(self, layers: usize, every: Option<usize>) -> Option<usize> {
        match self {
            Self::Recompute(l) => kept_segment(l, layers, every),
            _ => None,
        }
    }
}

/// The index of `layer`'s segment when `layer` starts a recomputed segment.
pub(crate) fn kept_segment(layer: usize, layers: usize, every: Option<usize>) -> Option<usize> {
    let starts = checkpoint_segment(layer, layers, every).start == layer;
    (starts && is_recomputed(layer, layers, every)).then(|| layer / every.unwrap_or(1))
}

/// The forward pass of a model of `layers` layers: embedding, blocks, head.
pub fn forward_ops(layers: usize) -> Vec<GptOp> {
    let mut ops = vec![GptOp::Embed];
    ops.extend((0..layers).map(GptOp::Block));
    ops.push(GptOp::Head);
    ops
}

/// One training micro-step of a model of `layers` layers, checkpointing every `every` blocks
/// or none: the forward pass, the head's backward, each block's backward in reverse (a
/// dropped segment recomputed first, when backward reaches its last block) and the
/// embedding's backward.
pub fn train_ops(layers: usize, every: Option<usize>) -> Vec<GptOp> {
    let mut ops = forward_ops(layers);
    ops.extend([GptOp::HeadBackwardInput, GptOp::HeadBackwardWeight]);
    for layer in (0..layers).rev() {
        let segment = checkpoint_segment(layer, layers, every);
        if layer + 1 == segment.end && is_recomputed(layer, layers, every) {
            ops.extend(segment.map(GptOp::Recompute));
        }
        ops.push(GptOp::BlockBackward(layer));
    }
    ops.push(GptOp::EmbedBackward);
    ops
}

/// The blocks of `layer`'s checkpointed segment in a model of `layers` layers: runs of
/// `every` blocks from the first (the last may be shorter); just `layer` without
/// checkpointing.
pub fn checkpoint_segment(layer: usize, layers: usize, every: Option<usize>) -> Range<usize> {
    match every {
        None => layer..layer + 1,
        Some(k) => {
            let start = layer - layer % k;
            start..(start + k).min(layers)
        }
    }
}

/// True when `layer`'s segment is run forward again in backward: with checkpointing, every
/// segment but the last, whose activations the forward pass leaves in place.
pub fn is_recomputed(layer: usize, layers: usize, every: Option<usize>) -> bool {
    every.is_some()
        && layers > 0
        && checkpoint_segment(layer, layers, every).start
            != checkpoint_segment(layers - 1, layers, every).start
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_of_five_layers_every_two_are_0_1_2_3_and_4() {
        let seg = |l| checkpoint_segment(l, 5, Some(2));
        assert_eq!(
            [seg(0), seg(1), seg(2), seg(3), seg(4)],
            [0..2, 0..2, 2..4, 2..4, 4..5]
        );
        assert_eq!(checkpoint_segment(3, 5, None), 3..4);
        let recomputed: Vec<bool> = (0..5).map(|l| is_recomputed(l, 5, Some(2))).collect();
        assert_eq!(recomputed, [true, true, true, true, false]);
    }

    #[test]
    fn a_checkpointed_step_recomputes_each_dropped_segment_once_before_its_backward() {
        use GptOp::*;
        let ops = train_ops(3, Some(2));
        let tail = &ops[ops.len() - 6..];
        // Layers 0-1 form the dropped segment; layer 2 (the last segment) keeps its forward.
        assert_eq!(
            tail,
            [
                BlockBackward(2),
                Recompute(0),
                Recompute(1),
                BlockBackward(1),
                BlockBackward(0),
                EmbedBackward
            ]
        );
        assert_eq!(ops.iter().filter(|o| matches!(o, Recompute(_))).count(), 2);
    }

    #[test]
    fn recomputed_segments_are_kept_by_their_first_block_and_restored_by_its_recompute() {
        use GptOp::*;
        let (layers, every) = (5, Some(2));
        let keeps: Vec<_> = (0..5).map(|l| Block(l).keeps(layers, every)).collect();
        // Segments 0..2 and 2..4 are recomputed; 4..5 keeps its forward.
        assert_eq!(keeps, [Some(0), None, Some(1), None, None]);
        let restores: Vec<_> = (0..5)
            .map(|l| Recompute(l).restores(layers, every))
            .collect();
        assert_eq!(restores, [Some(0), None, Some(1), None, None]);
        assert_eq!(Block(0).keeps(layers, None), None);
        assert_eq!(Head.restores(layers, every), None);
    }
}
