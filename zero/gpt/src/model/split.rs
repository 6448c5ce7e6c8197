//! One rank of a tensor-parallel group of T ranks running the blocks Megatron's way
//! (Shoeybi et al. 2019): the block's matrices are cut between the ranks, everything else is
//! computed whole on every rank, and two all-reduces (sums over the group) per block and per
//! direction join the parts. The model owns no communicator: it stops where a reduction is
//! due and hands out the buffer ([`Gpt::tp_partial`]); the caller sums it over the group, in
//! place, before the next call.
//!
//! Legend: B batch, T here the tensor-parallel size, S sequence, C channels, NH heads,
//! N = B*S, r this rank.
//!
//! What rank r holds (see `crate::split` for the slicing): the rows of `qkvw`/`qkvb` of its
//! NH/T heads (column-parallel: its heads' q, k, v (N,3C/T) need no communication), the
//! matching C/T columns of `attprojw` (row-parallel: its (N,C) output is a partial sum over
//! heads), rows r of `fcw`/`fcb` (4C/T, column-parallel) and the matching columns of
//! `fcprojw` (row-parallel again). The LayerNorms and the two output biases are replicated.
//! The attention's three tensors are one unit, the MLP's another (see `layout`): the
//! attention calls take the first, the MLP calls the second, each with the replicated unit.
//! The embedding, the tied LM head and the final LayerNorm are whole on every rank of a
//! [`Gpt::with_tensor_parallel`] model ([`Gpt::embed_forward`], [`Gpt::head_forward`] and
//! their backward run as at T = 1, every rank computing the same values); a
//! [`Gpt::with_vocab_parallel`] model splits `wte` by vocabulary rows instead (see
//! `model::split_head`).
//!
//! Block `l` on every rank, with the caller's all-reduce between the calls:
//!
//! - forward: [`Gpt::tp_attention_forward`] (ln1, this rank's heads, its part of attproj),
//!   all-reduce, [`Gpt::tp_mlp_forward`] (residual, ln2, its MLP columns, its part of
//!   fcproj), all-reduce, [`Gpt::tp_block_output`] (residual). These are Megatron's `g`.
//! - backward: [`Gpt::tp_mlp_backward`] (this rank's part of d(ln2 output)), all-reduce,
//!   [`Gpt::tp_attention_backward`] (ln2 backward, this rank's part of d(ln1 output)),
//!   all-reduce, [`Gpt::tp_block_input_grad`] (ln1 backward). These are the conjugate of
//!   Megatron's `f`: every rank read the whole LayerNorm output, so its gradient is the sum
//!   of the ranks' parts, and it must be whole before the LayerNorm backward.
//!
//! The row-parallel biases (`attprojb`, `fcprojb`) are added by rank 0 alone, into its
//! partial output, so the sum carries them once. Their gradients, and every other
//! replicated gradient, come from whole (reduced) values that every rank holds alike, so
//! they are the same on every rank (to the bit when every rank receives the same sum).

use super::Gpt;
use crate::activations::{Activations, Progress, SplitStep};
use crate::backend::{Backend, View};
use crate::error::{GptError, Result};
use crate::tp_program::{attention_units, mlp_units};
use crate::views::{carve, carve_mut, sub, sub_mut};

/// The shapes one rank's split block runs at.
#[derive(Clone, Copy)]
pub(super) struct Dims {
    pub b: usize,
    pub s: usize,
    pub n: usize,
    pub c: usize,
    /// This rank's attention width, C/T.
    pub cw: usize,
    /// This rank's MLP width, 4C/T.
    pub fw: usize,
    /// This rank's heads, NH/T.
    pub nh: usize,
}

/// Index of `attproj` in the layer views ([`crate::LAYER_VIEWS`]).
const ATTPROJ: usize = 6;
/// Index of `fcproj` in the layer views.
const FCPROJ: usize = 13;

impl<B: Backend> Gpt<B> {
    pub(super) fn tp_dims(&self, acts: &Activations<B>) -> Dims {
        let t = self.split.size;
        let c = self.config.channels;
        Dims {
            b: acts.b,
            s: acts.t,
            n: acts.b * acts.t,
            c,
            cw: c / t,
            fw: 4 * c / t,
            nh: self.config.num_heads / t,
        }
    }

    /// Refuses a split call on a whole model, a layer past L, parameter or gradient units of
    /// the wrong size (`(unit, length, what)`), or a call out of order (`want`).
    pub(super) fn check_tp_call(
        &self,
        acts: &Activations<B>,
        layer: usize,
        units: &[(usize, usize, &'static str)],
        want: Progress,
        call: &'static str,
    ) -> Result<()> {
        if self.split.size < 2 {
            return Err(GptError::OutOfOrder {
                call,
                reason: "the model is not split over a tensor-parallel group (T = 1): run \
                         whole blocks (Gpt::block_forward, Gpt::block_backward)"
                    .into(),
            });
        }
        self.check_layer(layer)?;
        for &(unit, got, what) in units {
            self.check_unit(unit, got, what)?;
        }
        self.check_call_order(acts, want, call)
    }

    /// This rank's row-parallel bias: the bias on rank 0, none elsewhere, so the sum over
    /// the group adds it once.
    fn rank0_bias<'a>(&self, bias: &'a B::Slice) -> Option<&'a B::Slice> {
        (self.split.rank == 0).then_some(bias)
    }

    /// Block `layer`, first part: ln1 (replicated), q, k, v of this rank's heads, attention
    /// over them, and this rank's partial attention output (N,C) = atty_r · attprojw_rᵀ (plus
    /// `attprojb` on rank 0). That partial is then due for the group's sum
    /// ([`Gpt::tp_partial`]).
    ///
    /// `slice` and `replicated` are block `layer`'s attention slice and replicated units of
    /// [`ParamLayout::split`] (the MLP slice is [`Gpt::tp_mlp_forward`]'s).
    ///
    /// With activation checkpointing ([`Gpt::activations_checkpointed`]) the same three
    /// calls and their reductions recompute a segment in backward, when
    /// [`Activations::needs_recompute`] says so before the backward of its last block: its
    /// blocks in order, each ending in backward again.
    ///
    /// # Errors
    /// A whole model, wrong buffer sizes, a layer past L, or a call out of order (block
    /// `layer - 1` not finished).
    pub fn tp_attention_forward(
        &self,
        acts: &mut Activations<B>,
        layer: usize,
        slice: &B::Slice,
        replicated: &B::Slice,
    ) -> Result<()> {
        let units = Self::tp_param_units(attention_units(layer), [slice, replicated]);
        self.begin_tp_block(acts, layer, &units)?;
        let Dims {
            b, s, n, c, cw, nh, ..
        } = self.tp_dims(acts);
        let be = &self.backend;
        let [qkvw, qkvb, attprojw] = carve(slice, self.layout.units()[units[0].0].lens());
        let [ln1w, ln1b, attprojb, _, _, _] =
            carve(replicated, self.layout.units()[units[1].0].lens());
        let (offset, len) = (acts.layer_offset(layer), acts.layer_len());
        let (before, rest) = acts.fwd.floats_mut().split_at_mut(offset);
        let x = sub(before, offset - n * c..offset); // (N,C) the block's input
        let [ln1, ln1_mean, ln1_rstd, qkv, atty, att, attproj, ..] =
            carve_mut(sub_mut(rest, 0..len), acts.layer_lens);
        be.layernorm_forward(ln1, ln1_mean, ln1_rstd, x, ln1w, ln1b, n, c);
        be.matmul_forward(qkv, ln1, qkvw, Some(qkvb), n, c, 3 * cw); // (N,3C/T)
        be.attention_forward(atty, att, qkv, b, s, cw, nh); // (N,C/T)
        let bias = self.rank0_bias(attprojb);
        be.matmul_forward(attproj, atty, attprojw, bias, n, cw, c); // (N,C) partial
        acts.progress = Progress::Split {
            layer,
            done: SplitStep::AttentionPartial,
        };
        Ok(())
    }

    /// Block `layer`, second part, after the attention output was summed over the group:
    /// res2 = x + attproj, ln2 (replicated), this rank's 4C/T MLP columns and GELU, and its
    /// partial MLP output (N,C) = gelu_r · fcprojw_rᵀ (plus `fcprojb` on rank 0), then due
    /// for the group's sum ([`Gpt::tp_partial`]). `slice` is block `layer`'s MLP slice unit.
    ///
    /// # Errors
    /// As [`Gpt::tp_attention_forward`]; the attention output not handed out for its sum.
    pub fn tp_mlp_forward(
        &self,
        acts: &mut Activations<B>,
        layer: usize,
        slice: &B::Slice,
        replicated: &B::Slice,
    ) -> Result<()> {
        let units = Self::tp_param_units(mlp_units(layer), [slice, replicated]);
        let want = split_at(layer, SplitStep::AttentionReduced);
        self.check_tp_call(acts, layer, &units, want, "tp_mlp_forward")?;
        let Dims { n, c, fw, .. } = self.tp_dims(acts);
        let be = &self.backend;
        let [fcw, fcb, fcprojw] = carve(slice, self.layout.units()[units[0].0].lens());
        let [_, _, _, ln2w, ln2b, fcprojb] =
            carve(replicated, self.layout.units()[units[1].0].lens());
        let (offset, len) = (acts.layer_offset(layer), acts.layer_len());
        let (before, rest) = acts.fwd.floats_mut().split_at_mut(offset);
        let x = sub(before, offset - n * c..offset); // (N,C) the block's input
        let [_, _, _, _, _, _, attproj, res2, ln2, ln2_mean, ln2_rstd, fch, fch_gelu, fcproj, _] =
            carve_mut(sub_mut(rest, 0..len), acts.layer_lens);
        be.residual_forward(res2, x, attproj);
        be.layernorm_forward(ln2, ln2_mean, ln2_rstd, res2, ln2w, ln2b, n, c);
        be.matmul_forward(fch, ln2, fcw, Some(fcb), n, c, fw); // (N,4C/T)
        be.gelu_forward(fch_gelu, fch);
        let bias = self.rank0_bias(fcprojb);
        be.matmul_forward(fcproj, fch_gelu, fcprojw, bias, n, fw, c); // (N,C) partial
        acts.progress = split_at(layer, SplitStep::MlpPartial);
        Ok(())
    }

    /// Block `layer`, last part, after the MLP output was summed over the group: the block's
    /// output res3 = res2 + fcproj (replicated). Block `layer + 1` (or the head) may run; in
    /// a recompute, the next block of the segment or the backward.
    ///
    /// # Errors
    /// A whole model, a layer past L, or the MLP output not handed out for its sum.
    pub fn tp_block_output(&self, acts: &mut Activations<B>, layer: usize) -> Result<()> {
        let want = split_at(layer, SplitStep::MlpReduced);
        self.check_tp_call(acts, layer, &[], want, "tp_block_output")?;
        let (offset, len) = (acts.layer_offset(layer), acts.layer_len());
        let region = sub_mut(acts.fwd.floats_mut(), offset..offset + len);
        let [_, _, _, _, _, _, _, res2, _, _, _, _, _, fcproj, res3] =
            carve_mut(region, acts.layer_lens);
        self.backend.residual_forward(res3, res2, fcproj);
        let segment = acts.segment(layer);
        if !acts.recomputing {
            acts.valid_segment = Some(segment.start);
            acts.progress = Progress::Forward { next: layer + 2 };
            return Ok(());
        }
        // A recompute: back to the backward of the segment's last block.
        acts.recomputing = false;
        if layer + 1 == segment.end {
            acts.valid_segment = Some(segment.start);
            acts.recompute_next = None;
        } else {
            acts.recompute_next = Some(layer + 1);
        }
        acts.progress = Progress::Backward { next: segment.end };
        Ok(())
    }

    /// Checks a [`Gpt::tp_attention_forward`] call and readies the activations: in forward,
    /// the block's input kept when it starts a checkpointed segment; in backward, the
    /// recompute of a checkpointed segment, in order (as [`Gpt::block_recompute`]'s), its
    /// first block putting the kept input back.
    fn begin_tp_block(
        &self,
        acts: &mut Activations<B>,
        layer: usize,
        units: &[(usize, usize, &'static str)],
    ) -> Result<()> {
        self.check_layer(layer)?;
        let segment = acts.segment(layer);
        let forward = Progress::Forward { next: layer + 1 };
        let recompute = acts.every.is_some() && matches!(acts.progress, Progress::Backward { .. });
        if !recompute {
            self.check_tp_call(acts, layer, units, forward, "tp_attention_forward")?;
            if acts.every.is_some() && segment.start == layer {
                acts.begin_segment(&self.backend, layer)?;
            }
            acts.recomputing = false;
            return Ok(());
        }
        // The segment's recompute is due when backward reaches its last block.
        let due = Progress::Backward { next: segment.end };
        self.check_tp_call(acts, layer, units, due, "tp_attention_forward (recompute)")?;
        let in_order = if layer == segment.start {
            acts.needs_recompute(layer)
        } else {
            acts.recompute_next == Some(layer)
        };
        if !in_order {
            return Err(GptError::OutOfOrder {
                call: "tp_attention_forward (recompute)",
                reason: format!("block {layer} is not the next block its segment recomputes"),
            });
        }
        if layer == segment.start {
            acts.restore_segment(&self.backend, layer)?;
            acts.valid_segment = None;
        }
        acts.recomputing = true;
        Ok(())
    }

    /// The buffer the group's collective is due on now, handed out once: the caller sums it
    /// over the group in place (an all-reduce) before the next call. It is the partial
    /// attention or MLP output (N,C) in forward, this rank's part of d(ln2 output) or
    /// d(ln1 output) (N,C) in backward; with the vocabulary split also the partial
    /// embedding (N,C), the loss statistics (N,T+1) and the partial d(lnf) (N,C) (see
    /// `model::split_head`).
    ///
    /// # Errors
    /// [`GptError::OutOfOrder`] when no split call just left a partial buffer.
    pub fn tp_partial<'a>(&self, acts: &'a mut Activations<B>) -> Result<&'a mut B::Slice> {
        self.check_acts(acts)?;
        let due = match acts.progress {
            Progress::Split { layer, done } => {
                done.after_reduction(layer).map(|next| (layer, done, next))
            }
            _ => None,
        };
        let Some((layer, done, next)) = due else {
            return Err(no_partial(acts.progress));
        };
        acts.progress = next;
        let (n, c, tp) = (acts.b * acts.t, self.config.channels, self.split.size);
        let lens = acts.layer_lens;
        let (buffer, from, len) = match done {
            SplitStep::AttentionPartial | SplitStep::MlpPartial => {
                let view = if done == SplitStep::MlpPartial {
                    FCPROJ
                } else {
                    ATTPROJ
                };
                let from = acts.layer_offset(layer) + lens[..view].iter().sum::<usize>();
                (acts.fwd.floats_mut(), from, n * c)
            }
            SplitStep::EmbedPartial => (acts.fwd.floats_mut(), 0, n * c),
            SplitStep::LossStatsPartial => {
                // The statistics follow this rank's logits (N,Vp/T) in the logits view.
                let logits = acts.head_offset() + acts.head_lens[..3].iter().sum::<usize>();
                let from = logits + n * self.config.padded_vocab_size / tp;
                (acts.fwd.floats_mut(), from, n * (tp + 1))
            }
            // dln, after dres in the backward scratch.
            _ => (acts.grad.floats_mut(), acts.grad_lens[0], n * c),
        };
        Ok(sub_mut(buffer, from..from + len))
    }
}

/// The progress after `step` of block `layer`'s split pass.
pub(super) fn split_at(layer: usize, done: SplitStep) -> Progress {
    Progress::Split { layer, done }
}

fn no_partial(progress: Progress) -> GptError {
    GptError::OutOfOrder {
        call: "tp_partial",
        reason: format!("no partial buffer is due for a collective (state {progress:?})"),
    }
}

#[cfg(test)]
mod tests {
    use super::{ATTPROJ, FCPROJ};
    use crate::LAYER_VIEWS;

    #[test]
    fn partial_outputs_name_their_views() {
        assert_eq!(LAYER_VIEWS[ATTPROJ], "attproj");
        assert_eq!(LAYER_VIEWS[FCPROJ], "fcproj");
    }
}
