//! The GPT-2 model: forward and backward unit by unit over caller-owned parameter buffers.
//!
//! Legend: B batch, T sequence, C channels, L layers, NH heads, N = B*T, V vocabulary,
//! Vp padded vocabulary, maxT = `max_seq_len`.
//!
//! The model owns no parameters and no gradients: every call takes the unit buffers it needs
//! as views of its backend's memory (`B::Slice`: `[f32]` on the CPU; see `layout`), so the
//! ZeRO engine decides where they live and when they exist. Every kernel runs through the
//! [`Backend`] trait (see `backend` for the views and the memory operations).
//! Forward order: `embed_forward`, `block_forward(0..L)`, `head_forward`. Backward is the
//! exact reverse: `head_backward`, `block_backward(L-1..0)`, `embed_backward`.
//!
//! The LM head is tied to `wte`: `head_forward`/`head_backward` read the EMBEDDING unit's
//! parameters, and `head_backward` and `embed_backward` each add their part of d(wte) into
//! the embedding gradient buffer they are given: one buffer kept from the head's backward to
//! the embedding's, or two buffers (the head's part, the encoder's part) that the caller sums
//! or reduces separately, so nothing of unit 0 need stay alive across the blocks.
//!
//! Gradients accumulate (`+=`) into the caller's buffers: zero them before the first
//! micro-batch of a step; further micro-batches add to them.

mod checks;
mod head;
mod kept_io;
mod split;
mod split_backward;
mod split_head;
mod split_step;
mod step;

use super::activations::{Activations, Buffer, KeptBy, Progress, Sizes};
use super::backend::{Backend, CpuBackend, View};
use super::config::GptConfig;
use super::error::{GptError, Result};
use super::layout::ParamLayout;
use super::split::TpSplit;
use super::views::{carve, carve_mut, sub, sub_mut};
use checks::check_ids;

/// A GPT-2 model: its shape, its size table and the backend that runs its kernels (the CPU
/// by default). Parameters, gradients and activations are views of the backend's memory.
#[derive(Debug, Clone)]
pub struct Gpt<B: Backend = CpuBackend> {
    config: GptConfig,
    layout: ParamLayout,
    backend: B,
    /// This rank's place in its tensor-parallel group ([`TpSplit::NONE`]: whole blocks).
    split: TpSplit,
}

impl Gpt {
    /// A model of shape `config` on the CPU.
    ///
    /// # Errors
    /// [`GptError::InvalidConfig`] if `config` does not validate.
    pub fn new(config: GptConfig) -> Result<Self> {
        Self::with_backend(config, CpuBackend)
    }
}

impl<B: Backend> Gpt<B> {
    /// A model of shape `config` whose kernels run on `backend`.
    ///
    /// # Errors
    /// [`GptError::InvalidConfig`] if `config` does not validate.
    pub fn with_backend(config: GptConfig, backend: B) -> Result<Self> {
        config.validate()?;
        Ok(Self {
            layout: ParamLayout::new(&config),
            config,
            backend,
            split: TpSplit::NONE,
        })
    }

    /// Rank `split.rank` of a tensor-parallel group of `split.size` ranks running a model of
    /// shape `config` on `backend`, Megatron's way (see `model::split` for the calls and
    /// where the group's reductions go). Its layout is [`ParamLayout::split`]: each block is
    /// three units, its attention slice, its MLP slice and its replicated tensors; the
    /// embedding, the tied LM head and the final LayerNorm stay whole on every rank (on the
    /// CPU, [`Gpt::with_vocab_parallel`] splits the embedding and the head). At `split.size` = 1 the same model as
    /// [`Gpt::with_backend`].
    ///
    /// # Errors
    /// [`GptError::InvalidConfig`] if `config` does not validate, or `split` does not
    /// ([`TpSplit::validate`]: T must divide the heads).
    pub fn with_tensor_parallel(config: GptConfig, backend: B, split: TpSplit) -> Result<Self> {
        config.validate()?;
        split.validate(&config)?;
        Ok(Self {
            layout: ParamLayout::split(&config, split.size),
            config,
            backend,
            split,
        })
    }

    /// This rank's place in its tensor-parallel group ([`TpSplit::NONE`] when whole).
    #[must_use]
    pub fn tensor_parallel(&self) -> TpSplit {
        self.split
    }

    /// The backend that runs the kernels.
    #[must_use]
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The model's shape.
    #[must_use]
    pub fn config(&self) -> &GptConfig {
        &self.config
    }

    /// The parameter (and gradient) size table.
    #[must_use]
    pub fn layout(&self) -> &ParamLayout {
        &self.layout
    }

    /// Training FLOPs per token at sequence length `seq_len`: 6 per parameter (forward 2,
    /// backward 4, the llm.c/PaLM count; padded vocabulary rows included) plus causal
    /// attention's 6·L·T·C (scores and weighted sum over T/2 keys on average, forward and
    /// backward). Multiply by tokens per second for achieved FLOP/s. Split over a
    /// tensor-parallel group, this rank's: its units' parameters, its C/T of the attention.
    #[must_use]
    pub fn flops_per_token(&self, seq_len: usize) -> f64 {
        let cfg = &self.config;
        6.0 * self.layout.num_params() as f64
            + 6.0 * (cfg.num_layers * seq_len * cfg.channels / self.split.size) as f64
    }

    /// Activation buffers for batches of shape (B, T).
    ///
    /// # Errors
    /// [`GptError::BadBatch`] if the shape is empty or T > maxT.
    pub fn activations(&self, b: usize, t: usize) -> Result<Activations<B>> {
        self.activations_checkpointed(b, t, None)
    }

    /// Activation buffers for batches (B, T) that keep only every `every`-th block's input
    /// and recompute the rest in backward (`None`: keep everything).
    ///
    /// # Errors
    /// As [`Gpt::activations`]; also `every == Some(0)`.
    pub fn activations_checkpointed(
        &self,
        b: usize,
        t: usize,
        every: Option<usize>,
    ) -> Result<Activations<B>> {
        if self.split.size == 1 {
            return Activations::in_backend(&self.backend, &self.config, b, t, every);
        }
        let (config, tp, vocab) = (&self.config, self.split.size, self.layout.vocab_parallel());
        Activations::in_backend_split(&self.backend, config, (b, t), every, tp, vocab)
    }

    /// Elements (4 bytes each) of every activation buffer of this model for (B, T) batches
    /// with checkpointing every `every` blocks (or none), in
    /// [`BUFFER_NAMES`](crate::BUFFER_NAMES) order: what [`Gpt::activations_with_memory`]
    /// asks for. At T = 1 [`activation_buffers`](crate::activation_buffers)'; split over a
    /// tensor-parallel group, this rank's (its heads', MLP columns' and, vocabulary split,
    /// logits' share).
    ///
    /// # Errors
    /// As [`Gpt::activations_checkpointed`].
    pub fn activation_buffers(
        &self,
        b: usize,
        t: usize,
        every: Option<usize>,
    ) -> Result<[usize; 6]> {
        let (tp, vocab) = (self.split.size, self.layout.vocab_parallel());
        Ok(Sizes::split(&self.config, b, t, every, tp, vocab)?.buffers())
    }

    /// [`Activations::with_backend_memory`] for this model, at any tensor-parallel split:
    /// every buffer from `alloc` (index in [`BUFFER_NAMES`](crate::BUFFER_NAMES), length from
    /// [`Gpt::activation_buffers`]), the kept block inputs held by the activations or by the
    /// caller (`kept`: [`Gpt::keep_input`], [`Gpt::restore_input`]).
    ///
    /// # Errors
    /// As [`Gpt::activations_checkpointed`], and the errors of `alloc`.
    pub fn activations_with_memory<E: From<GptError>>(
        &self,
        (b, t): (usize, usize),
        every: Option<usize>,
        alloc: impl FnMut(usize, usize) -> std::result::Result<Buffer<B::Slice>, E>,
        kept: KeptBy,
    ) -> std::result::Result<Activations<B>, E> {
        let split = (self.split.size, self.layout.vocab_parallel());
        Activations::build(&self.backend, &self.config, b, t, every, alloc, kept, split)
    }

    /// Embeds `tokens` (B,T): `encoded = wte[tokens] + wpe`. Starts a new forward pass.
    ///
    /// # Errors
    /// Wrong buffer sizes, or a token >= V.
    pub fn embed_forward(
        &self,
        acts: &mut Activations<B>,
        embed: &B::Slice,
        tokens: &[u32],
    ) -> Result<()> {
        self.check_acts(acts)?;
        self.check_whole_vocab("embed_forward")?;
        self.check_unit(0, embed.len(), "embedding parameters")?;
        check_ids("tokens", tokens, acts.b * acts.t, self.config.vocab_size)?;
        let (b, t, c) = (acts.b, acts.t, self.config.channels);
        let [wte, wpe] = carve(embed, self.layout.units()[0].lens()); // (Vp,C), (maxT,C)
        let be = &self.backend;
        be.upload_ids(B::ids_mut(acts.tokens.floats_mut()), tokens);
        let encoded = sub_mut(acts.fwd.floats_mut(), 0..b * t * c); // (B,T,C)
        be.encoder_forward(encoded, B::ids(acts.tokens.floats()), wte, wpe, b, t, c);
        acts.valid_segment = None;
        acts.recompute_next = None;
        acts.progress = Progress::Forward { next: 1 };
        Ok(())
    }

    /// Runs transformer block `layer` on the previous unit's output.
    ///
    /// # Errors
    /// Wrong buffer size, a layer past L, or a call out of order.
    pub fn block_forward(
        &self,
        acts: &mut Activations<B>,
        layer: usize,
        params: &B::Slice,
    ) -> Result<()> {
        let unit = self.block_unit(layer)?;
        self.check_unit(unit, params.len(), "block parameters")?;
        self.check_call_order(acts, Progress::Forward { next: unit }, "block_forward")?;
        let segment = acts.segment(layer);
        if acts.every.is_some() && segment.start == layer {
            acts.begin_segment(&self.backend, layer)?;
        }
        self.block_compute(acts, layer, params);
        acts.valid_segment = Some(segment.start);
        acts.progress = Progress::Forward { next: unit + 1 };
        Ok(())
    }

    /// Checkpointing: runs block `layer` forward again, in backward, before the backward of
    /// its segment. A segment's blocks are recomputed in order, first to last, when backward
    /// reaches the segment's last block ([`Activations::needs_recompute`]); the results are
    /// the forward's to the bit (the same kernels on the same input).
    ///
    /// # Errors
    /// Wrong buffer size, a layer past L, no checkpointing, or a call out of order.
    pub fn block_recompute(
        &self,
        acts: &mut Activations<B>,
        layer: usize,
        params: &B::Slice,
    ) -> Result<()> {
        self.block_unit(layer)?;
        let segment = acts.segment(layer);
        let due = ParamLayout::block_unit(segment.end - 1);
        self.check_call_order(acts, Progress::Backward { next: due }, "block_recompute")?;
        let in_order = if layer == segment.start {
            acts.needs_recompute(layer)
        } else {
            acts.recompute_next == Some(layer)
        };
        if !in_order {
            return Err(GptError::OutOfOrder {
                call: "block_recompute",
                reason: format!("block {layer} is not the next block its segment recomputes"),
            });
        }
        self.check_unit(
            ParamLayout::block_unit(layer),
            params.len(),
            "block parameters",
        )?;
        if layer == segment.start {
            acts.restore_segment(&self.backend, layer)?;
            acts.valid_segment = None;
        }
        self.block_compute(acts, layer, params);
        if layer + 1 == segment.end {
            acts.valid_segment = Some(segment.start);
            acts.recompute_next = None;
        } else {
            acts.recompute_next = Some(layer + 1);
        }
        Ok(())
    }

    /// Block `layer`'s forward arithmetic, from its input to its output, into its region.
    fn block_compute(&self, acts: &mut Activations<B>, layer: usize, params: &B::Slice) {
        let unit = ParamLayout::block_unit(layer);
        let be = &self.backend;
        let (b, t, c, nh) = (acts.b, acts.t, self.config.channels, self.config.num_heads);
        let n = b * t;
        // Parameters: ln1w (C), ln1b (C), qkvw (3C,C), qkvb (3C), attprojw (C,C), attprojb (C),
        // ln2w (C), ln2b (C), fcw (4C,C), fcb (4C), fcprojw (C,4C), fcprojb (C).
        let [ln1w, ln1b, qkvw, qkvb, attprojw, attprojb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb] =
            carve(params, self.layout.units()[unit].lens());
        let (offset, len) = (acts.layer_offset(layer), acts.layer_len());
        let (before, rest) = acts.fwd.floats_mut().split_at_mut(offset);
        let x = sub(before, offset - n * c..offset); // (N,C) the block's input

        // Activations: ln1 (N,C), ln1_mean (N), ln1_rstd (N), qkv (N,3C), atty (N,C),
        // att (B,T,NH,T), attproj (N,C), res2 (N,C), ln2 (N,C), ln2_mean (N), ln2_rstd (N),
        // fch (N,4C), fch_gelu (N,4C), fcproj (N,C), res3 (N,C).
        let [ln1, ln1_mean, ln1_rstd, qkv, atty, att, attproj, res2, ln2, ln2_mean, ln2_rstd, fch, fch_gelu, fcproj, res3] =
            carve_mut(sub_mut(rest, 0..len), acts.layer_lens);
        be.layernorm_forward(ln1, ln1_mean, ln1_rstd, x, ln1w, ln1b, n, c);
        be.matmul_forward(qkv, ln1, qkvw, Some(qkvb), n, c, 3 * c);
        be.attention_forward(atty, att, qkv, b, t, c, nh);
        be.matmul_forward(attproj, atty, attprojw, Some(attprojb), n, c, c);
        be.residual_forward(res2, x, attproj);
        be.layernorm_forward(ln2, ln2_mean, ln2_rstd, res2, ln2w, ln2b, n, c);
        be.matmul_forward(fch, ln2, fcw, Some(fcb), n, c, 4 * c);
        be.gelu_forward(fch_gelu, fch);
        be.matmul_forward(fcproj, fch_gelu, fcprojw, Some(fcprojb), n, 4 * c, c);
        be.residual_forward(res3, res2, fcproj);
    }

    /// Backward of block `layer`: adds its parameter gradients into `grads` and turns the
    /// residual gradient at its output into the one at its input.
    ///
    /// # Errors
    /// Wrong buffer sizes, a layer past L, or a call out of order.
    pub fn block_backward(
        &self,
        acts: &mut Activations<B>,
        layer: usize,
        params: &B::Slice,
        grads: &mut B::Slice,
    ) -> Result<()> {
        let unit = self.check_block_backward(acts, layer, params.len(), grads.len())?;
        let be = &self.backend;
        let (b, t, c, nh) = (acts.b, acts.t, self.config.channels, self.config.num_heads);
        let n = b * t;
        // Parameters and their gradients (d-prefixed): ln1w (C), ln1b (C), qkvw (3C,C),
        // qkvb (3C), attprojw (C,C), attprojb (C), ln2w (C), ln2b (C), fcw (4C,C), fcb (4C),
        // fcprojw (C,4C), fcprojb (C).
        let lens = self.layout.units()[unit].lens();
        let [ln1w, _, qkvw, _, attprojw, _, ln2w, _, fcw, _, fcprojw, _] = carve(params, lens);
        let [dln1w, dln1b, dqkvw, dqkvb, dattprojw, dattprojb, dln2w, dln2b, dfcw, dfcb, dfcprojw, dfcprojb] =
            carve_mut(grads, lens);
        let (offset, len) = (acts.layer_offset(layer), acts.layer_len());
        let x = sub(acts.fwd.floats(), offset - n * c..offset); // (N,C) the block's input

        // Activations: ln1 (N,C), ln1_mean (N), ln1_rstd (N), qkv (N,3C), atty (N,C),
        // att (B,T,NH,T), attproj (N,C), res2 (N,C), ln2 (N,C), ln2_mean (N), ln2_rstd (N),
        // fch (N,4C), fch_gelu (N,4C), fcproj (N,C), res3 (N,C).
        let [ln1, ln1_mean, ln1_rstd, qkv, atty, att, _, res2, ln2, ln2_mean, ln2_rstd, fch, fch_gelu, _, _] =
            carve(
                sub(acts.fwd.floats(), offset..offset + len),
                acts.layer_lens,
            );
        // dres (N,C) holds d(block output) and leaves holding d(block input).
        let [dres, dln, datty, dqkv, dfch, dfch_gelu] =
            carve_mut(acts.grad.floats_mut(), acts.grad_lens);
        for scratch in [
            &mut *dln,
            &mut *datty,
            &mut *dqkv,
            &mut *dfch,
            &mut *dfch_gelu,
        ] {
            be.fill(scratch, 0.0);
        }
        // MLP branch; the residual passes dres through unchanged, and ln2's input gradient is
        // added onto it, giving d(res2).
        be.matmul_backward(
            dfch_gelu,
            dfcprojw,
            Some(dfcprojb),
            dres,
            fch_gelu,
            fcprojw,
            n,
            4 * c,
            c,
        );
        be.gelu_backward(dfch, fch, dfch_gelu);
        be.matmul_backward(dln, dfcw, Some(dfcb), dfch, ln2, fcw, n, c, 4 * c);
        be.layernorm_backward(
            dres, dln2w, dln2b, dln, res2, ln2w, ln2_mean, ln2_rstd, n, c,
        );
        // Attention branch, the same way, giving d(x).
        be.matmul_backward(
            datty,
            dattprojw,
            Some(dattprojb),
            dres,
            atty,
            attprojw,
            n,
            c,
            c,
        );
        be.attention_backward(dqkv, datty, qkv, att, b, t, c, nh);
        be.fill(dln, 0.0);
        be.matmul_backward(dln, dqkvw, Some(dqkvb), dqkv, ln1, qkvw, n, c, 3 * c);
        be.layernorm_backward(dres, dln1w, dln1b, dln, x, ln1w, ln1_mean, ln1_rstd, n, c);
        acts.progress = Progress::Backward { next: unit - 1 };
        Ok(())
    }

    /// Backward of the embedding: adds d(wte) rows and d(wpe) into `embed_grad`, finishing the
    /// backward pass.
    ///
    /// # Errors
    /// Wrong buffer size, or a call out of order.
    pub fn embed_backward(
        &self,
        acts: &mut Activations<B>,
        embed_grad: &mut B::Slice,
    ) -> Result<()> {
        self.check_whole_vocab("embed_backward")?;
        self.check_unit(0, embed_grad.len(), "embedding gradients")?;
        self.check_call_order(acts, Progress::Backward { next: 0 }, "embed_backward")?;
        let (b, t, c) = (acts.b, acts.t, self.config.channels);
        let [dwte, dwpe] = carve_mut(embed_grad, self.layout.units()[0].lens());
        let [dres, ..] = carve(acts.grad.floats(), acts.grad_lens); // (N,C)
        let tokens = B::ids(acts.tokens.floats());
        self.backend
            .encoder_backward(dwte, dwpe, dres, tokens, b, t, c);
        acts.progress = Progress::Done;
        Ok(())
    }
}
