//! The embedding and the tied LM head of a rank whose vocabulary is split over the
//! tensor-parallel group ([`Gpt::with_vocab_parallel`], Megatron's vocab-parallel embedding
//! and cross-entropy; the kernels are `kernels::vocab_parallel`, on the CPU only).
//!
//! Legend: B batch, S sequence, C channels, N = B*S, V vocabulary, Vp padded vocabulary,
//! T the tensor-parallel size, W = Vp/T, L layers.
//!
//! Rank r holds rows `r*W..(r+1)*W` of `wte` (unit 0), `wpe` whole (unit 3L+1) and the final
//! LayerNorm whole (unit 3L+2). Three more all-reduces (sums) per step, the buffers handed
//! out by [`Gpt::tp_partial`] as for the blocks:
//!
//! - [`Gpt::tp_embed_forward`]: this rank's tokens' rows (others 0), plus `wpe` on rank 0:
//!   all-reduce, and block 0 is due.
//! - [`Gpt::tp_head_forward`]: lnf (replicated), this rank's logits (N,W) and its loss
//!   statistics (N,T+1); all-reduce; [`Gpt::tp_head_loss`] gives the loss.
//! - [`Gpt::tp_head_backward_input`]: d(logits) (N,W) and this rank's part of d(lnf);
//!   all-reduce; [`Gpt::tp_head_backward_rest`]: lnf's backward (d(lnfw), d(lnfb)) into the
//!   block's residual gradient, and this rank's rows of d(wte) from the head.
//! - [`Gpt::tp_embed_backward`]: this rank's rows of d(wte) from the encoder, and d(wpe)
//!   (the same on every rank).

use super::split::split_at;
use super::{check_ids, Gpt};
use crate::activations::{Activations, Progress, SplitStep};
use crate::backend::{Backend, CpuBackend};
use crate::config::GptConfig;
use crate::error::{GptError, Result};
use crate::kernels::vocab_parallel::{self, VocabSlice};
use crate::layout::ParamLayout;
use crate::split::TpSplit;
use crate::views::{carve, carve_mut};

impl Gpt {
    /// Rank `split.rank` of a tensor-parallel group of `split.size` ranks on the CPU that
    /// splits the vocabulary as well as the blocks: its layout is
    /// [`ParamLayout::split_vocab`], its embedding and head run as the `tp_embed_*` and
    /// `tp_head_*` calls (see `model::split_head`), its blocks as the split blocks'. At
    /// `split.size` = 1 the same model as [`Gpt::new`].
    ///
    /// # Errors
    /// [`GptError::InvalidConfig`] if `config` or `split` does not validate
    /// ([`TpSplit::validate_vocab`]: T must divide the heads and Vp).
    pub fn with_vocab_parallel(config: GptConfig, split: TpSplit) -> Result<Self> {
        config.validate()?;
        split.validate_vocab(&config)?;
        Ok(Self {
            layout: ParamLayout::split_vocab(&config, split.size),
            config,
            backend: CpuBackend,
            split,
        })
    }

    fn vocab_slice(&self) -> VocabSlice {
        let (cfg, split) = (&self.config, self.split);
        VocabSlice::new(
            cfg.vocab_size,
            cfg.padded_vocab_size,
            split.size,
            split.rank,
        )
    }

    /// Refuses a vocab-parallel call on a model whose vocabulary is whole, activations of
    /// another model, units of the wrong size (`(unit, length, what)`), or a call out of
    /// order (`want`; `None` for a call that starts a pass).
    fn check_vocab_call(
        &self,
        acts: &Activations,
        units: &[(usize, usize, &'static str)],
        want: Option<Progress>,
        call: &'static str,
    ) -> Result<()> {
        if !self.layout.vocab_parallel() {
            return Err(GptError::OutOfOrder {
                call,
                reason: "the vocabulary is not split (Gpt::with_vocab_parallel, T > 1): run \
                         the whole embedding and head (Gpt::embed_forward and the rest)"
                    .into(),
            });
        }
        self.check_acts(acts)?;
        for &(unit, got, what) in units {
            self.check_unit(unit, got, what)?;
        }
        match want {
            Some(want) => self.check_call_order(acts, want, call),
            None => Ok(()),
        }
    }

    /// The unit of `wpe` with the vocabulary split (3L+1).
    fn positions(&self) -> usize {
        self.layout.num_units() - 2
    }

    /// This rank's part of the embedding of `tokens` (B,S): the rows of the tokens it holds
    /// (`wte`, its (W,C) rows), 0 for the others, plus `wpe` on rank 0. Starts a forward
    /// pass; the (N,C) part is then due for the group's sum ([`Gpt::tp_partial`]).
    ///
    /// # Errors
    /// A whole vocabulary, wrong buffer sizes, or a token >= V.
    pub fn tp_embed_forward(
        &self,
        acts: &mut Activations,
        wte: &[f32],
        wpe: &[f32],
        tokens: &[u32],
    ) -> Result<()> {
        let units = [
            (0, wte.len(), "embedding slice"),
            (self.positions(), wpe.len(), "position embedding"),
        ];
        self.check_vocab_call(acts, &units, None, "tp_embed_forward")?;
        check_ids("tokens", tokens, acts.b * acts.t, self.config.vocab_size)?;
        let (nc, s, c) = (
            acts.b * acts.t * self.config.channels,
            acts.t,
            self.config.channels,
        );
        let be = &self.backend;
        be.upload_ids(CpuBackend::ids_mut(acts.tokens.floats_mut()), tokens);
        let ids = CpuBackend::ids(acts.tokens.floats());
        let wpe = (self.split.rank == 0).then_some(wpe);
        let encoded = &mut acts.fwd.floats_mut()[..nc];
        vocab_parallel::embed_forward(encoded, ids, wte, wpe, self.vocab_slice(), s, c);
        acts.valid_segment = None;
        acts.recompute_next = None;
        acts.progress = split_at(0, SplitStep::EmbedPartial);
        Ok(())
    }

    /// The final LayerNorm (replicated), this rank's logits (N,W) = lnf · wte_rᵀ and its
    /// loss statistics for `targets` (B,S); those are then due for the group's sum
    /// ([`Gpt::tp_partial`]), after which [`Gpt::tp_head_loss`] gives the loss.
    ///
    /// # Errors
    /// A whole vocabulary, wrong buffer sizes, a target >= V, or a call out of order.
    pub fn tp_head_forward(
        &self,
        acts: &mut Activations,
        final_norm: &[f32],
        wte: &[f32],
        targets: &[u32],
    ) -> Result<()> {
        let last = self.layout.final_norm_unit();
        let units = [
            (last, final_norm.len(), "final norm parameters"),
            (0, wte.len(), "embedding slice"),
        ];
        let want = Progress::Forward {
            next: self.config.num_layers + 1,
        };
        self.check_vocab_call(acts, &units, Some(want), "tp_head_forward")?;
        check_ids("targets", targets, acts.b * acts.t, self.config.vocab_size)?;
        let be = &self.backend;
        be.upload_ids(CpuBackend::ids_mut(acts.targets.floats_mut()), targets);
        let (n, c, vocab) = (acts.b * acts.t, self.config.channels, self.vocab_slice());
        let [lnfw, lnfb] = carve(final_norm, self.layout.units()[last].lens());
        let (input, offset) = (acts.head_input_offset(), acts.head_offset());
        let (before, head) = acts.fwd.floats_mut().split_at_mut(offset);
        let x = &before[input..input + n * c]; // (N,C) the last block's output
        let [lnf, lnf_mean, lnf_rstd, logits, _] = carve_mut(head, acts.head_lens);
        let (logits, stats) = logits.split_at_mut(n * vocab.width);
        be.layernorm_forward(lnf, lnf_mean, lnf_rstd, x, lnfw, lnfb, n, c);
        be.matmul_forward(logits, lnf, wte, None, n, c, vocab.width);
        let ids = CpuBackend::ids(acts.targets.floats());
        let (rank, tp) = (self.split.rank, self.split.size);
        vocab_parallel::loss_stats(stats, logits, ids, vocab, rank, tp);
        acts.progress = split_at(self.config.num_layers, SplitStep::LossStatsPartial);
        Ok(())
    }

    /// This rank's logits (N,W), ids `rank*W..(rank+1)*W` of each position, as
    /// [`Gpt::tp_head_forward`] left them (before [`Gpt::tp_head_loss`] turns them into
    /// probabilities): what a sampler gathers over the group.
    ///
    /// # Errors
    /// A whole vocabulary, activations of another model, or no `tp_head_forward` just before.
    pub fn tp_logits<'a>(&self, acts: &'a Activations) -> Result<&'a [f32]> {
        let want = split_at(self.config.num_layers, SplitStep::LossStatsPartial);
        self.check_vocab_call(acts, &[], Some(want), "tp_logits")?;
        let n = acts.b * acts.t;
        let fwd = acts.fwd.floats();
        let [_, _, _, logits, _] = carve(&fwd[acts.head_offset()..], acts.head_lens);
        Ok(&logits[..n * self.vocab_slice().width])
    }

    /// After the loss statistics were summed over the group: the per-position losses, this
    /// rank's probabilities (N,W) in place of its logits, and the mean loss, returned (the
    /// same on every rank). Backward may start.
    ///
    /// # Errors
    /// A whole vocabulary, or the statistics not handed out for their sum.
    pub fn tp_head_loss(&self, acts: &mut Activations) -> Result<f32> {
        let want = split_at(self.config.num_layers, SplitStep::LossStatsReduced);
        self.check_vocab_call(acts, &[], Some(want), "tp_head_loss")?;
        let (n, vocab) = (acts.b * acts.t, self.vocab_slice());
        let offset = acts.head_offset();
        let head = &mut acts.fwd.floats_mut()[offset..];
        let [_, _, _, logits, losses] = carve_mut(head, acts.head_lens);
        let (logits, stats) = logits.split_at_mut(n * vocab.width);
        vocab_parallel::loss_from_stats(losses, logits, stats, vocab);
        let mean = self.backend.mean(losses)?;
        acts.progress = Progress::Loss;
        Ok(mean)
    }

    /// The head's backward down to this rank's part of d(lnf) (N,C) = d(logits_r) · wte_r;
    /// that part is then due for the group's sum ([`Gpt::tp_partial`]).
    ///
    /// # Errors
    /// A whole vocabulary, a wrong buffer size, or no [`Gpt::tp_head_loss`] just before.
    pub fn tp_head_backward_input(&self, acts: &mut Activations, wte: &[f32]) -> Result<()> {
        let units = [(0, wte.len(), "embedding slice")];
        let want = Some(Progress::Loss);
        self.check_vocab_call(acts, &units, want, "tp_head_backward_input")?;
        let (n, c, vocab) = (acts.b * acts.t, self.config.channels, self.vocab_slice());
        let offset = acts.head_offset();
        let head = &mut acts.fwd.floats_mut()[offset..];
        let [_, _, _, logits, _] = carve_mut(head, acts.head_lens);
        let probs = &mut logits[..n * vocab.width];
        let targets = CpuBackend::ids(acts.targets.floats());
        vocab_parallel::loss_backward(probs, acts.dlosses.floats(), targets, vocab);
        let [_, dln, ..] = carve_mut(acts.grad.floats_mut(), acts.grad_lens);
        dln.fill(0.0);
        self.backend
            .matmul_backward_input(dln, probs, wte, n, c, vocab.width);
        acts.progress = split_at(self.config.num_layers, SplitStep::HeadGradPartial);
        Ok(())
    }

    /// After d(lnf) was summed over the group: the final LayerNorm's backward (d(lnfw),
    /// d(lnfb) into `final_norm_grad`, d(last block output) into the residual gradient) and
    /// the head's d(wte_r) = d(logits_r)ᵀ · lnf into `wte_grad` (this rank's rows). Block
    /// L-1 is then due.
    ///
    /// # Errors
    /// A whole vocabulary, wrong buffer sizes, or d(lnf) not handed out for its sum.
    pub fn tp_head_backward_rest(
        &self,
        acts: &mut Activations,
        final_norm: &[f32],
        final_norm_grad: &mut [f32],
        wte_grad: &mut [f32],
    ) -> Result<()> {
        let last = self.layout.final_norm_unit();
        let units = [
            (last, final_norm.len(), "final norm parameters"),
            (last, final_norm_grad.len(), "final norm gradients"),
            (0, wte_grad.len(), "embedding slice gradients"),
        ];
        let want = split_at(self.config.num_layers, SplitStep::HeadGradReduced);
        self.check_vocab_call(acts, &units, Some(want), "tp_head_backward_rest")?;
        let (n, c, vocab) = (acts.b * acts.t, self.config.channels, self.vocab_slice());
        let [lnfw, _] = carve(final_norm, self.layout.units()[last].lens());
        let [dlnfw, dlnfb] = carve_mut(final_norm_grad, self.layout.units()[last].lens());
        let (input, offset) = (acts.head_input_offset(), acts.head_offset());
        let (before, head) = acts.fwd.floats().split_at(offset);
        let x = &before[input..input + n * c]; // (N,C) the last block's output
        let [lnf, lnf_mean, lnf_rstd, logits, _] = carve(head, acts.head_lens);
        let dlogits = &logits[..n * vocab.width];
        let [dres, dln, ..] = carve_mut(acts.grad.floats_mut(), acts.grad_lens);
        let be = &self.backend;
        dres.fill(0.0);
        be.layernorm_backward(dres, dlnfw, dlnfb, dln, x, lnfw, lnf_mean, lnf_rstd, n, c);
        be.matmul_backward_weight(wte_grad, None, dlogits, lnf, n, c, vocab.width);
        acts.progress = Progress::Backward {
            next: self.config.num_layers,
        };
        Ok(())
    }

    /// The embedding's backward, finishing the pass: this rank's rows of d(wte) from the
    /// encoder into `wte_grad`, and d(wpe) (the same on every rank) into `wpe_grad`.
    ///
    /// # Errors
    /// A whole vocabulary, wrong buffer sizes, or a call out of order.
    pub fn tp_embed_backward(
        &self,
        acts: &mut Activations,
        wte_grad: &mut [f32],
        wpe_grad: &mut [f32],
    ) -> Result<()> {
        let units = [
            (0, wte_grad.len(), "embedding slice gradients"),
            (
                self.positions(),
                wpe_grad.len(),
                "position embedding gradients",
            ),
        ];
        let want = Some(Progress::Backward { next: 0 });
        self.check_vocab_call(acts, &units, want, "tp_embed_backward")?;
        let (s, c) = (acts.t, self.config.channels);
        let [dres, ..] = carve(acts.grad.floats(), acts.grad_lens); // (N,C)
        let tokens = CpuBackend::ids(acts.tokens.floats());
        let vocab = self.vocab_slice();
        vocab_parallel::embed_backward(wte_grad, wpe_grad, dres, tokens, vocab, s, c);
        acts.progress = Progress::Done;
        Ok(())
    }
}
