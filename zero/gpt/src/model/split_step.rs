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
    /// Block `layer` forward on this rank, its units (attention slice, MLP slice, replicated)
    /// given: [`Gpt::tp_attention_forward`], `all_reduce`,
    /// [`Gpt::tp_mlp_forward`], `all_reduce`, [`Gpt::tp_block_output`]; in backward, its
    /// recompute (checkpointing).
    ///
    /// # Errors
    /// As those calls, and `all_reduce`'s.
    pub fn tp_block_forward<E: From<GptError>>(
        &self,
        acts: &mut Activations<B>,
        layer: usize,
        [attention, mlp, replicated]: [&B::Slice; 3],
        all_reduce: &mut dyn FnMut(&mut B::Slice) -> Result<(), E>,
    ) -> Result<(), E> {
        self.tp_attention_forward(acts, layer, attention, replicated)?;
        all_reduce(self.tp_partial(acts)?)?;
        self.tp_mlp_forward(acts, layer, mlp, replicated)?;
        all_reduce(self.tp_partial(acts)?)?;
        Ok(self.tp_block_output(acts, layer)?)
    }

    /// Block `layer` backward on this rank, its units and their gradients given (attention
    /// slice, MLP slice, replicated): [`Gpt::tp_mlp_backward`], `all_reduce`,
    /// [`Gpt::tp_attention_backward`], `all_reduce`, [`Gpt::tp_block_input_grad`].
    ///
    /// # Errors
    /// As those calls, and `all_reduce`'s.
    pub fn tp_block_backward<E: From<GptError>>(
        &self,
        acts: &mut Activations<B>,
        layer: usize,
        [attention, mlp, replicated]: [&B::Slice; 3],
        [attention_grad, mlp_grad, replicated_grad]: [&mut B::Slice; 3],
        all_reduce: &mut dyn FnMut(&mut B::Slice) -> Result<(), E>,
    ) -> Result<(), E> {
        let mlp_params = [mlp, replicated];
        self.tp_mlp_backward(acts, layer, mlp_params, mlp_grad, &mut *replicated_grad)?;
        all_reduce(self.tp_partial(acts)?)?;
        let attention_params = [attention, replicated];
        let replicated_grad = &mut *replicated_grad;
        self.tp_attention_backward(
            acts,
            layer,
            attention_params,
            attention_grad,
            replicated_grad,
        )?;
        all_reduce(self.tp_partial(acts)?)?;
        Ok(self.tp_block_input_grad(acts, layer, replicated, replicated_grad)?)
    }

    /// One training micro-step of this rank of a split model, as [`Gpt::forward_backward`]:
    /// `params` and `grads` hold one buffer per unit of [`ParamLayout::split`] (3L + 2),
    /// the embedding and final norm whole, each block's slices and replicated units; every
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
        let block = |layer| ParamLayout::split_block_units(layer).map(|u| params[u].as_ref());
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
            let unit_grads = block_grads(rest, layer, 1)?;
            self.tp_block_backward(acts, layer, block(layer), unit_grads, all_reduce)?;
        }
        self.embed_backward(acts, embed_grad)?;
        Ok(loss)
    }
}

/// Block `layer`'s gradient buffers (attention slice, MLP slice, replicated) in `grads`, the
/// units of a split layout from unit `first` on (consecutive, see
/// [`ParamLayout::split_block_units`]).
fn block_grads<S: ?Sized, G: AsMut<S>>(
    grads: &mut [G],
    layer: usize,
    first: usize,
) -> Result<[&mut S; 3], GptError> {
    let at = ParamLayout::split_block_units(layer)[0] - first;
    let got = grads.len();
    match grads.get_mut(at..at + 3) {
        Some([a, m, r]) => Ok([a.as_mut(), m.as_mut(), r.as_mut()]),
        _ => Err(GptError::SizeMismatch {
            what: "gradient units of a split block",
            expected: at + 3,
            got,
        }),
    }
}

impl Gpt {
    /// One training micro-step of this rank of a model whose vocabulary is split too
    /// ([`Gpt::with_vocab_parallel`]), as [`Gpt::tp_forward_backward`]: `params` and
    /// `grads` hold one buffer per unit of [`ParamLayout::split_vocab`] (3L + 3), and
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
        // wpe is the unit before the final norm (ParamLayout::split_vocab).
        let last = self.layout.final_norm_unit();
        let positions = last - 1;
        let block = |layer| ParamLayout::split_block_units(layer).map(|u| params[u].as_ref());
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
        // Units: wte slice | 3L block units | wpe | final norm.
        let (wte_grad, rest) = grads.split_at_mut(1);
        let (blocks, outer) = rest.split_at_mut(3 * layers);
        let (wpe_grad, final_grad) = outer.split_at_mut(1);
        let wte_grad = wte_grad[0].as_mut();
        self.tp_head_backward_rest(acts, final_norm, final_grad[0].as_mut(), wte_grad)?;
        for layer in (0..layers).rev() {
            if acts.needs_recompute(layer) {
                for r in acts.segment(layer) {
                    self.tp_block_forward(acts, r, block(r), all_reduce)?;
                }
            }
            let unit_grads = block_grads(blocks, layer, 1)?;
            self.tp_block_backward(acts, layer, block(layer), unit_grads, all_reduce)?;
        }
        self.tp_embed_backward(acts, wte_grad, wpe_grad[0].as_mut())?;
        Ok(loss)
    }
}
