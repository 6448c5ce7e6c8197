//! The backward of a block split over a tensor-parallel group (see `model::split` for what
//! each rank holds and where the reductions go): three calls per block, the caller summing
//! the buffer [`Gpt::tp_partial`] hands out over the group between them.
//!
//! Legend: T the tensor-parallel size, C channels, N = B*S rows.
//!
//! On entry `dres` (the backward scratch's first (N,C) view) holds d(block output), whole
//! and the same on every rank (the head runs replicated, and each block leaves it whole);
//! on exit it holds d(block input), likewise.

use super::split::{split_at, Dims};
use super::Gpt;
use crate::activations::{Activations, Progress, SplitStep};
use crate::backend::{Backend, View};
use crate::error::{GptError, Result};
use crate::layout::ParamLayout;
use crate::tp_program::{attention_units, mlp_units};
use crate::views::{carve, carve_mut, sub};

impl<B: Backend> Gpt<B> {
    /// The size checks of a split backward call: its two units (a slice of block `layer`
    /// and its replicated unit), parameters and gradients.
    fn tp_grad_units(
        units: [usize; 2],
        params: [&B::Slice; 2],
        grads: [&B::Slice; 2],
    ) -> [(usize, usize, &'static str); 4] {
        let [slice, replicated] = Self::tp_param_units(units, params);
        [
            slice,
            replicated,
            (slice.0, grads[0].len(), "block slice gradients"),
            (replicated.0, grads[1].len(), "block replicated gradients"),
        ]
    }

    /// A split call's two `units` (a block's attention or MLP slice, then its replicated
    /// unit) as the call checks them: (unit, the length given, what it is).
    pub(super) fn tp_param_units(
        [slice_unit, replicated_unit]: [usize; 2],
        [slice, replicated]: [&B::Slice; 2],
    ) -> [(usize, usize, &'static str); 2] {
        [
            (slice_unit, slice.len(), "block slice"),
            (replicated_unit, replicated.len(), "block replicated"),
        ]
    }

    /// Backward of block `layer`'s MLP down to this rank's part of d(ln2 output): adds
    /// d(fcprojw_r), d(fcw_r), d(fcb_r) into `slice_grad` (of the MLP slice unit) and
    /// d(fcprojb) (replicated: the column sums of the whole d(block output)) into
    /// `replicated_grad`. That part is then due for the group's sum ([`Gpt::tp_partial`]).
    ///
    /// Gradients accumulate (`+=`), as [`Gpt::block_backward`]'s.
    ///
    /// # Errors
    /// A whole model, wrong buffer sizes, a layer past L, or a call out of order.
    pub fn tp_mlp_backward(
        &self,
        acts: &mut Activations<B>,
        layer: usize,
        [slice, replicated]: [&B::Slice; 2],
        slice_grad: &mut B::Slice,
        replicated_grad: &mut B::Slice,
    ) -> Result<()> {
        let units = Self::tp_grad_units(
            mlp_units(layer),
            [slice, replicated],
            [&*slice_grad, &*replicated_grad],
        );
        let want = Progress::Backward { next: layer + 1 };
        self.check_tp_call(acts, layer, &units, want, "tp_mlp_backward")?;
        if acts.needs_recompute(layer) {
            return Err(GptError::OutOfOrder {
                call: "tp_mlp_backward",
                reason: format!("block {layer}'s checkpointed segment was not recomputed"),
            });
        }
        let Dims { n, c, fw, .. } = self.tp_dims(acts);
        let be = &self.backend;
        let [fcw, _, fcprojw] = carve(slice, self.layout.units()[units[0].0].lens());
        let [dfcw, dfcb, dfcprojw] = carve_mut(slice_grad, self.layout.units()[units[0].0].lens());
        let [_, _, _, _, _, dfcprojb] =
            carve_mut(replicated_grad, self.layout.units()[units[1].0].lens());
        let (offset, len) = (acts.layer_offset(layer), acts.layer_len());
        let [_, _, _, _, _, _, _, _, ln2, _, _, fch, fch_gelu, _, _] = carve(
            sub(acts.fwd.floats(), offset..offset + len),
            acts.layer_lens,
        );
        let [dres, dln, _, _, dfch, dfch_gelu] = carve_mut(acts.grad.floats_mut(), acts.grad_lens);
        for scratch in [&mut *dln, &mut *dfch, &mut *dfch_gelu] {
            be.fill(scratch, 0.0);
        }
        let (dout, w) = (&*dres, fcprojw);
        be.matmul_backward(
            dfch_gelu,
            dfcprojw,
            Some(dfcprojb),
            dout,
            fch_gelu,
            w,
            n,
            fw,
            c,
        );
        be.gelu_backward(dfch, fch, dfch_gelu);
        be.matmul_backward(dln, dfcw, Some(dfcb), dfch, ln2, fcw, n, c, fw); // partial
        acts.progress = split_at(layer, SplitStep::MlpGradPartial);
        Ok(())
    }

    /// After d(ln2 output) was summed over the group: ln2's backward (d(ln2w), d(ln2b) into
    /// `replicated_grad`, its input gradient added onto `dres`, giving d(res2)), then the
    /// attention's backward down to this rank's part of d(ln1 output): d(attprojb)
    /// (replicated) and d(attprojw_r), d(qkvw_r), d(qkvb_r) (into `slice_grad`, of the
    /// attention slice unit). That part is then due for the group's sum
    /// ([`Gpt::tp_partial`]).
    ///
    /// # Errors
    /// As [`Gpt::tp_mlp_backward`]; d(ln2 output) not handed out for its sum.
    pub fn tp_attention_backward(
        &self,
        acts: &mut Activations<B>,
        layer: usize,
        [slice, replicated]: [&B::Slice; 2],
        slice_grad: &mut B::Slice,
        replicated_grad: &mut B::Slice,
    ) -> Result<()> {
        let units = Self::tp_grad_units(
            attention_units(layer),
            [slice, replicated],
            [&*slice_grad, &*replicated_grad],
        );
        let want = split_at(layer, SplitStep::MlpGradReduced);
        self.check_tp_call(acts, layer, &units, want, "tp_attention_backward")?;
        let Dims {
            b, s, n, c, cw, nh, ..
        } = self.tp_dims(acts);
        let be = &self.backend;
        let [qkvw, _, attprojw] = carve(slice, self.layout.units()[units[0].0].lens());
        let [_, _, _, ln2w, _, _] = carve(replicated, self.layout.units()[units[1].0].lens());
        let [dqkvw, dqkvb, dattprojw] =
            carve_mut(slice_grad, self.layout.units()[units[0].0].lens());
        let [_, _, dattprojb, dln2w, dln2b, _] =
            carve_mut(replicated_grad, self.layout.units()[units[1].0].lens());
        let (offset, len) = (acts.layer_offset(layer), acts.layer_len());
        let [ln1, _, _, qkv, atty, att, _, res2, _, ln2_mean, ln2_rstd, _, _, _, _] = carve(
            sub(acts.fwd.floats(), offset..offset + len),
            acts.layer_lens,
        );
        let [dres, dln, datty, dqkv, _, _] = carve_mut(acts.grad.floats_mut(), acts.grad_lens);
        be.layernorm_backward(
            dres, dln2w, dln2b, dln, res2, ln2w, ln2_mean, ln2_rstd, n, c,
        );
        be.fill(datty, 0.0);
        be.fill(dqkv, 0.0);
        let (dout, w) = (&*dres, attprojw);
        be.matmul_backward(datty, dattprojw, Some(dattprojb), dout, atty, w, n, cw, c);
        be.attention_backward(dqkv, datty, qkv, att, b, s, cw, nh);
        be.fill(dln, 0.0);
        be.matmul_backward(dln, dqkvw, Some(dqkvb), dqkv, ln1, qkvw, n, c, 3 * cw); // partial
        acts.progress = split_at(layer, SplitStep::AttentionGradPartial);
        Ok(())
    }

    /// After d(ln1 output) was summed over the group: ln1's backward, adding d(ln1w),
    /// d(ln1b) into `replicated_grad` and leaving d(block input) in `dres`. Block
    /// `layer - 1` (or the embedding) is then due.
    ///
    /// # Errors
    /// A whole model, wrong buffer sizes, a layer past L, or d(ln1 output) not handed out
    /// for its sum.
    pub fn tp_block_input_grad(
        &self,
        acts: &mut Activations<B>,
        layer: usize,
        replicated: &B::Slice,
        replicated_grad: &mut B::Slice,
    ) -> Result<()> {
        let unit = ParamLayout::replicated_unit(layer);
        let units = [
            (unit, replicated.len(), "block replicated"),
            (unit, replicated_grad.len(), "block replicated gradients"),
        ];
        let want = split_at(layer, SplitStep::AttentionGradReduced);
        self.check_tp_call(acts, layer, &units, want, "tp_block_input_grad")?;
        let Dims { n, c, .. } = self.tp_dims(acts);
        let [ln1w, ..] = carve(replicated, self.layout.units()[unit].lens::<6>());
        let [dln1w, dln1b, ..] = carve_mut(replicated_grad, self.layout.units()[unit].lens::<6>());
        let (offset, len) = (acts.layer_offset(layer), acts.layer_len());
        let x = sub(acts.fwd.floats(), offset - n * c..offset); // (N,C) the block's input
        let [_, ln1_mean, ln1_rstd, ..] = carve(
            sub(acts.fwd.floats(), offset..offset + len),
            acts.layer_lens,
        );
        let [dres, dln, ..] = carve_mut(acts.grad.floats_mut(), acts.grad_lens);
        let be = &self.backend;
        be.layernorm_backward(dres, dln1w, dln1b, dln, x, ln1w, ln1_mean, ln1_rstd, n, c);
        acts.progress = Progress::Backward { next: layer };
        Ok(())
    }
}
