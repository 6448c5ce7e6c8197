//! The whole-model drivers: forward through every unit, and one training micro-step.
//!
//! Legend: L layers.

use super::Gpt;
use crate::activations::Activations;
use crate::backend::Backend;
use crate::error::Result;
use crate::layout::ParamLayout;

impl<B: Backend> Gpt<B> {
    /// Forward through every unit; with targets returns the mean loss (and leaves the
    /// activations ready for backward), without targets leaves logits for [`Gpt::logits`].
    ///
    /// `params` holds one buffer per unit, in layout order.
    ///
    /// # Errors
    /// As the unit calls; also a wrong number of units.
    pub fn forward<P: AsRef<B::Slice>>(
        &self,
        acts: &mut Activations<B>,
        params: &[P],
        tokens: &[u32],
        targets: Option<&[u32]>,
    ) -> Result<Option<f32>> {
        self.check_num_units(params.len(), "parameter units")?;
        let last = self.layout.final_norm_unit();
        self.embed_forward(acts, params[0].as_ref(), tokens)?;
        for layer in 0..self.config.num_layers {
            self.block_forward(acts, layer, params[ParamLayout::block_unit(layer)].as_ref())?;
        }
        self.head_forward(acts, params[last].as_ref(), params[0].as_ref(), targets)
    }

    /// One training micro-step: forward with targets, then backward, adding the gradients
    /// into `grads` (one buffer per unit, layout order). Returns the mean loss.
    ///
    /// # Errors
    /// As the unit calls; also a wrong number of units.
    pub fn forward_backward<P: AsRef<B::Slice>, G: AsMut<B::Slice>>(
        &self,
        acts: &mut Activations<B>,
        params: &[P],
        grads: &mut [G],
        tokens: &[u32],
        targets: &[u32],
    ) -> Result<f32> {
        self.check_num_units(grads.len(), "gradient units")?;
        // With targets the head always returns Some(loss); NaN would only flag a broken
        // invariant, never reach a caller silently as a plausible number.
        let loss = self
            .forward(acts, params, tokens, Some(targets))?
            .unwrap_or(f32::NAN);
        let last = self.layout.final_norm_unit();
        let (embed_grad, rest) = grads.split_at_mut(1);
        let (block_grads, final_grad) = rest.split_at_mut(self.config.num_layers);
        let embed_grad = embed_grad[0].as_mut();
        self.head_backward(
            acts,
            params[last].as_ref(),
            params[0].as_ref(),
            final_grad[0].as_mut(),
            embed_grad,
        )?;
        for layer in (0..self.config.num_layers).rev() {
            let unit = ParamLayout::block_unit(layer);
            if acts.needs_recompute(layer) {
                for r in acts.segment(layer) {
                    self.block_recompute(acts, r, params[ParamLayout::block_unit(r)].as_ref())?;
                }
            }
            self.block_backward(
                acts,
                layer,
                params[unit].as_ref(),
                block_grads[layer].as_mut(),
            )?;
        }
        self.embed_backward(acts, embed_grad)?;
        Ok(loss)
    }
}
