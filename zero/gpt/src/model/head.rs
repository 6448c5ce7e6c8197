//! The final LayerNorm and the LM head tied to `wte`: forward with the loss, and a backward
//! in two halves (down to the head's input, which reads `wte`; then d(wte), which reads no
//! parameters) so an engine never holds `wte` and its whole gradient at once.
//!
//! Legend: N = B*T, C channels, V vocabulary, Vp padded vocabulary.

use super::{check_ids, Gpt};
use crate::activations::{Activations, Progress};
use crate::backend::{Backend, View};
use crate::error::Result;
use crate::views::{carve, carve_mut, sub};

impl<B: Backend> Gpt<B> {
    /// Final LayerNorm, tied LM head and, with `targets` (B,T), the mean cross-entropy.
    ///
    /// With `Some(targets)` returns the mean loss and readies backward; with `None` it stops at
    /// the logits ([`Gpt::logits`]) and returns `None`.
    ///
    /// # Errors
    /// Wrong buffer sizes, a target >= V, or a call out of order.
    pub fn head_forward(
        &self,
        acts: &mut Activations<B>,
        final_norm: &B::Slice,
        embed: &B::Slice,
        targets: Option<&[u32]>,
    ) -> Result<Option<f32>> {
        self.check_whole_vocab("head_forward")?;
        let last = self.layout.final_norm_unit();
        self.check_unit(last, final_norm.len(), "final norm parameters")?;
        self.check_unit(0, embed.len(), "embedding parameters")?;
        // Progress counts positions: the embedding 0, block l at l + 1, the head at L+1.
        let head = self.config.num_layers + 1;
        self.check_call_order(acts, Progress::Forward { next: head }, "head_forward")?;
        if let Some(targets) = targets {
            check_ids("targets", targets, acts.b * acts.t, self.config.vocab_size)?;
            self.backend
                .upload_ids(B::ids_mut(acts.targets.floats_mut()), targets);
        }
        let be = &self.backend;
        let (n, c) = (acts.b * acts.t, self.config.channels);
        let (v, vp) = (self.config.vocab_size, self.config.padded_vocab_size);
        let [lnfw, lnfb] = carve(final_norm, self.layout.units()[last].lens()); // (C,), (C,)
        let [wte, _] = carve(embed, self.layout.units()[0].lens()); // (Vp,C)
        let (input, offset) = (acts.head_input_offset(), acts.head_offset());
        let (before, head) = acts.fwd.floats_mut().split_at_mut(offset);
        let x = sub(before, input..input + n * c); // (N,C) last block's output
        let [lnf, lnf_mean, lnf_rstd, logits, losses] = carve_mut(head, acts.head_lens);
        be.layernorm_forward(lnf, lnf_mean, lnf_rstd, x, lnfw, lnfb, n, c);
        be.matmul_forward(logits, lnf, wte, None, n, c, vp);
        if targets.is_none() {
            acts.progress = Progress::Logits;
            return Ok(None);
        }
        be.crossentropy_forward(losses, logits, B::ids(acts.targets.floats()), n, v, vp);
        // The backend's mean: an f64 sum in index order, the same loss to the bit every run.
        let mean = be.mean(losses)?;
        acts.progress = Progress::Loss;
        Ok(Some(mean))
    }

    /// Logits (B,T,Vp) of the last `head_forward` without targets (columns V..Vp are padding).
    ///
    /// # Errors
    /// [`GptError::OutOfOrder`](crate::GptError::OutOfOrder) unless the last call was
    /// `head_forward(.., None)`.
    pub fn logits<'a>(&self, acts: &'a Activations<B>) -> Result<&'a B::Slice> {
        self.check_call_order(acts, Progress::Logits, "logits")?;
        let fwd = acts.fwd.floats();
        let [_, _, _, logits, _] = carve(sub(fwd, acts.head_offset()..fwd.len()), acts.head_lens);
        Ok(logits)
    }

    /// Backward of the head: [`Gpt::head_backward_input`] then [`Gpt::head_backward_weight`]
    /// (adds d(lnfw), d(lnfb) into `final_norm_grad` and the LM head's d(wte) into
    /// `embed_grad`, and seeds the residual gradient for the blocks).
    ///
    /// # Errors
    /// Wrong buffer sizes, or no `head_forward` with targets just before.
    pub fn head_backward(
        &self,
        acts: &mut Activations<B>,
        final_norm: &B::Slice,
        embed: &B::Slice,
        final_norm_grad: &mut B::Slice,
        embed_grad: &mut B::Slice,
    ) -> Result<()> {
        self.head_backward_input(acts, final_norm, embed, final_norm_grad)?;
        self.head_backward_weight(acts, embed_grad)
    }

    /// The head's backward down to its input, which reads the tied `wte` but not its
    /// gradient: turns the logits into d(logits), adds d(lnfw), d(lnfb) into
    /// `final_norm_grad` and seeds the residual gradient for the blocks.
    ///
    /// # Errors
    /// Wrong buffer sizes, or no `head_forward` with targets just before.
    pub fn head_backward_input(
        &self,
        acts: &mut Activations<B>,
        final_norm: &B::Slice,
        embed: &B::Slice,
        final_norm_grad: &mut B::Slice,
    ) -> Result<()> {
        self.check_whole_vocab("head_backward_input")?;
        let last = self.layout.final_norm_unit();
        self.check_unit(last, final_norm.len(), "final norm parameters")?;
        self.check_unit(last, final_norm_grad.len(), "final norm gradients")?;
        self.check_unit(0, embed.len(), "embedding parameters")?;
        self.check_call_order(acts, Progress::Loss, "head_backward")?;
        let be = &self.backend;
        let (n, c) = (acts.b * acts.t, self.config.channels);
        let (v, vp) = (self.config.vocab_size, self.config.padded_vocab_size);
        let [lnfw, _] = carve(final_norm, self.layout.units()[last].lens()); // (C,)
        let [dlnfw, dlnfb] = carve_mut(final_norm_grad, self.layout.units()[last].lens());
        let [wte, _] = carve(embed, self.layout.units()[0].lens()); // (Vp,C)
        let (input, offset) = (acts.head_input_offset(), acts.head_offset());
        let (before, head) = acts.fwd.floats_mut().split_at_mut(offset);
        let x = sub(before, input..input + n * c); // (N,C) last block's output
        let [_, lnf_mean, lnf_rstd, logits, _] = carve_mut(head, acts.head_lens);
        let [dres, dln, ..] = carve_mut(acts.grad.floats_mut(), acts.grad_lens); // (N,C) each
        let targets = B::ids(acts.targets.floats());
        be.crossentropy_backward(logits, acts.dlosses.floats(), targets, n, v, vp);
        be.fill(dln, 0.0);
        be.matmul_backward_input(dln, logits, wte, n, c, vp);
        be.fill(dres, 0.0);
        be.layernorm_backward(dres, dlnfw, dlnfb, dln, x, lnfw, lnf_mean, lnf_rstd, n, c);
        acts.progress = Progress::HeadWeight;
        Ok(())
    }

    /// The rest of the head's backward: adds the LM head's d(wte) = d(logits)ᵀ · lnf into
    /// `embed_grad` (tied weights; see the module doc). Needs no parameters.
    ///
    /// # Errors
    /// A wrong buffer size, or no [`Gpt::head_backward_input`] just before.
    pub fn head_backward_weight(
        &self,
        acts: &mut Activations<B>,
        embed_grad: &mut B::Slice,
    ) -> Result<()> {
        self.check_whole_vocab("head_backward_weight")?;
        self.check_unit(0, embed_grad.len(), "embedding gradients")?;
        self.check_call_order(acts, Progress::HeadWeight, "head_backward_weight")?;
        let (n, c, vp) = (
            acts.b * acts.t,
            self.config.channels,
            self.config.padded_vocab_size,
        );
        let [dwte, _] = carve_mut(embed_grad, self.layout.units()[0].lens()); // (Vp,C)
        let fwd = acts.fwd.floats();
        let [lnf, _, _, dlogits, _] =
            carve(sub(fwd, acts.head_offset()..fwd.len()), acts.head_lens);
        self.backend
            .matmul_backward_weight(dwte, None, dlogits, lnf, n, c, vp);
        acts.progress = Progress::Backward {
            next: self.config.num_layers,
        };
        Ok(())
    }
}
