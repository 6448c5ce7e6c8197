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
    /// [`Gpt::tp_mlp_forward`], `all_reduce`, [`Gpt::tp_block_output`].
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
