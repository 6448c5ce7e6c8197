//! Drivers of a split model for a caller that runs each rank of the tensor-parallel group on
//! its own thread or process: the calls of `model::split` in order, with the group's
//! all-reduce given as a closure that the driver calls on each buffer [`Gpt::tp_partial`]
//! hands out. The closure is the caller's (a communicator's all-reduce, or anything that
//! leaves the group's sum in the buffer on every rank); the model still owns none.
//!
//! Legend: L layers, T the tensor-parallel size.

use super::Gpt;
use crate::activations::Activations;
use crate::backend::Backend;
use crate::error::GptError;
use crate::layout::ParamLayout;

impl<B: Backend> Gpt<B> {
    /// Block `layer` forward on this rank: [`Gpt::tp_attention_forward`], `all_reduce`,
    /// [`Gpt::tp_mlp_forward`], `all_reduce`, [`Gpt::tp_block_output`]; in backward, its
    /// recompute (checkpointing).
    ///
    /// # Errors
    /// As those calls, and `all_reduce`'s.
    pub fn tp_block_forward<E: From<GptError>>(
        &self,
        acts: &mut Activations<B>,
        layer: usize,
        [slice, replicated]: [&B::Slice; 2],
        all_reduce: &mut dyn FnMut(&mut B::Slice) -> Result<(), E>,
    ) -> Result<(), E> {
        self.tp_attention_forward(acts, layer, slice, replicated)?;
        all_reduce(self.tp_partial(acts)?)?;
        self.tp_mlp_forward(acts, layer, slice, replicated)?;
        all_reduce(self.tp_partial(acts)?)?;
        Ok(self.tp_block_output(acts, layer)?)
    }

    /// Block `layer` backward on this rank: [`Gpt::tp_mlp_backward`], `all_reduce`,
    /// [`Gpt::tp_attention_backward`], `all_reduce`, [`Gpt::tp_block_input_grad`].
    ///
    /// # Errors
    /// As those calls, and `all_reduce`'s.
    pub fn tp_block_backward<E: From<GptError>>(
        &self,
        acts: &mut Activations<B>,
        layer: usize,
        params: [&B::Slice; 2],
        [slice_grad, replicated_grad]: [&mut B::Slice; 2],
        all_reduce: &mut dyn FnMut(&mut B::Slice) -> Result<(), E>,
    ) -> Result<(), E> {
        self.tp_mlp_backward(acts, layer, params, &mut *slice_grad, &mut *replicated_grad)?;
        all_reduce(self.tp_partial(acts)?)?;
        self.tp_attention_backward(acts, layer, params, slice_grad, &mut *replicated_grad)?;
        all_reduce(self.tp_partial(acts)?)?;
        Ok(self.tp_block_input_grad(acts, layer, params[1], replicated_grad)?)
    }

    /// One training micro-step of this rank of a split model, as [`Gpt::forward_backward`]:
    /// `params` and `grads` hold one buffer per unit of [`ParamLayout::split`] (2L + 2),
    /// the embedding and final norm whole, each block's slice and replicated units; every
    /// rank of the group calls it on the same tokens, and `all_reduce` is called 4L times,
    /// at the same points on every rank. Returns the mean loss (the same on every rank when
    /// `all_reduce` hands every rank the same sum).
    ///
    /// # Errors
    /// As the unit calls; also a wrong number of units, and `all_reduce`'s errors.
    pub fn tp_forward_backward<P, G, E>(
        &self,
        acts: &mut Activations<B>,
        params: &[P],
        grads: &mut [G],
        tokens: &[u32],
        targets: &[u32],
        all_reduce: &mut dyn FnMut(&mut B::Slice) -> Result<(), E>,
    ) -> Result<f32, E>
    where
        P: AsRef<B::Slice>,
        G: AsMut<B::Slice>,
        E: From<GptError>,
    {
        self.check_num_units(params.len(), "parameter units")?;
        self.check_num_units(grads.len(), "gradient units")?;
        let layers = self.config.num_layers;
        let last = self.layout.final_norm_unit();
        let block = |layer| {
            let (slice, replicated) = split_units(layer);
            [params[slice].as_ref(), params[replicated].as_ref()]
        };
        self.embed_forward(acts, params[0].as_ref(), tokens)?;
        for layer in 0..layers {
            self.tp_block_forward(acts, layer, block(layer), all_reduce)?;
        }
        let (final_norm, embed) = (params[last].as_ref(), params[0].as_ref());
        // With targets the head always returns Some(loss); NaN would flag a broken invariant.
        let loss = self
            .head_forward(acts, final_norm, embed, Some(targets))?
            .unwrap_or(f32::NAN);
        let (embed_grad, rest) = grads.split_at_mut(1);
        let embed_grad = embed_grad[0].as_mut();
        self.head_backward(acts, final_norm, embed, rest[last - 1].as_mut(), embed_grad)?;
        for layer in (0..layers).rev() {
            if acts.needs_recompute(layer) {
                for r in acts.segment(layer) {
                    self.tp_block_forward(acts, r, block(r), all_reduce)?;
                }
            }
            let (slice, replicated) = split_units(layer);
            let (before, after) = rest.split_at_mut(replicated - 1);
            let unit_grads = [before[slice - 1].as_mut(), after[0].as_mut()];
            self.tp_block_backward(acts, layer, block(layer), unit_grads, all_reduce)?;
        }
        self.embed_backward(acts, embed_grad)?;
        Ok(loss)
    }
}

/// Block `layer`'s units in a split layout: (slice, replicated).
fn split_units(layer: usize) -> (usize, usize) {
    (
        ParamLayout::slice_unit(layer),
        ParamLayout::replicated_unit(layer),
    )
}

impl Gpt {
    /// One training micro-step of this rank of a model whose vocabulary is split too
    /// ([`Gpt::with_vocab_parallel`]), as [`Gpt::tp_forward_backward`]: `params` and
    /// `grads` hold one buffer per unit of [`ParamLayout::split_vocab`] (2L + 3), and
    /// `all_reduce` is called 4L + 3 times (the embedding, the loss statistics and d(lnf)
    /// besides the blocks'), at the same points on every rank. Returns the mean loss.
    ///
    /// # Errors
    /// As the unit calls; also a wrong number of units, and `all_reduce`'s errors.
    pub fn tp_vocab_forward_backward<P, G, E>(
        &self,
        acts: &mut Activations,
        params: &[P],
        grads: &mut [G],
        tokens: &[u32],
        targets: &[u32],
        all_reduce: &mut dyn FnMut(&mut [f32]) -> Result<(), E>,
    ) -> Result<f32, E>
    where
        P: AsRef<[f32]>,
        G: AsMut<[f32]>,
        E: From<GptError>,
    {
        self.check_num_units(params.len(), "parameter units")?;
        self.check_num_units(grads.len(), "gradient units")?;
        let layers = self.config.num_layers;
        let (positions, last) = (2 * layers + 1, 2 * layers + 2);
        let block = |layer| {
            let (slice, replicated) = split_units(layer);
            [params[slice].as_ref(), params[replicated].as_ref()]
        };
        let (wte, wpe, final_norm) = (
            params[0].as_ref(),
            params[positions].as_ref(),
            params[last].as_ref(),
        );
        self.tp_embed_forward(acts, wte, wpe, tokens)?;
        all_reduce(self.tp_partial(acts)?)?;
        for layer in 0..layers {
            self.tp_block_forward(acts, layer, block(layer), all_reduce)?;
        }
        self.tp_head_forward(acts, final_norm, wte, targets)?;
        all_reduce(self.tp_partial(acts)?)?;
        let loss = self.tp_head_loss(acts)?;
        self.tp_head_backward_input(acts, wte)?;
        all_reduce(self.tp_partial(acts)?)?;
        // Units: wte slice | 2L block units | wpe | final norm.
        let (wte_grad, rest) = grads.split_at_mut(1);
        let (blocks, outer) = rest.split_at_mut(2 * layers);
        let (wpe_grad, final_grad) = outer.split_at_mut(1);
        let wte_grad = wte_grad[0].as_mut();
        self.tp_head_backward_rest(acts, final_norm, final_grad[0].as_mut(), wte_grad)?;
        for layer in (0..layers).rev() {
            if acts.needs_recompute(layer) {
                for r in acts.segment(layer) {
                    self.tp_block_forward(acts, r, block(r), all_reduce)?;
                }
            }
            let (before, after) = blocks.split_at_mut(2 * layer + 1);
            let unit_grads = [before[2 * layer].as_mut(), after[0].as_mut()];
            self.tp_block_backward(acts, layer, block(layer), unit_grads, all_reduce)?;
        }
        self.tp_embed_backward(acts, wte_grad, wpe_grad[0].as_mut())?;
        Ok(loss)
    }
}
