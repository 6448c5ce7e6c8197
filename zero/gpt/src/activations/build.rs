//! Constructing [`Activations`]: on the CPU from `Vec`s or a caller's allocator, and in any
//! backend's memory; every buffer is zeroed (and the loss gradients filled) by the backend.
//!
//! Legend: B batch, T sequence, C channels, N = B*T.

use super::{
    Activations, Buffer, GptConfig, GptError, Kept, KeptBy, Progress, Result, Sizes,
    BACKEND_SCRATCH, KEPT_INPUTS,
};
use crate::backend::{Backend, CpuBackend, View};

impl Activations {
    /// Buffers for batches of `b` sequences of `t` tokens, keeping every activation.
    ///
    /// # Errors
    /// [`GptError::BadBatch`] if B or T is 0, T exceeds `max_seq_len`, or the buffers would not
    /// be addressable.
    pub fn new(config: &GptConfig, b: usize, t: usize) -> Result<Self> {
        Self::with_checkpointing(config, b, t, None)
    }

    /// Buffers for batches (B, T) that keep only every `every`-th block input (`None`: every
    /// activation, as [`Activations::new`]).
    ///
    /// # Errors
    /// As [`Activations::new`]; also `every == Some(0)`.
    pub fn with_checkpointing(
        config: &GptConfig,
        b: usize,
        t: usize,
        every: Option<usize>,
    ) -> Result<Self> {
        Self::in_backend(&CpuBackend, config, b, t, every)
    }

    /// As [`Activations::with_checkpointing`], with every buffer taken from `alloc`, called
    /// once per buffer with its index in [`BUFFER_NAMES`](crate::BUFFER_NAMES) and its length in f32 elements
    /// ([`activation_buffers`](crate::activation_buffers) gives them all beforehand). Buffers are zeroed here whatever
    /// they held.
    ///
    /// # Errors
    /// As [`Activations::with_checkpointing`], and the errors of `alloc`.
    pub fn with_memory<E: From<GptError>>(
        config: &GptConfig,
        b: usize,
        t: usize,
        every: Option<usize>,
        alloc: impl FnMut(usize, usize) -> std::result::Result<Buffer, E>,
    ) -> std::result::Result<Self, E> {
        Self::with_backend_memory(&CpuBackend, config, b, t, every, alloc, KeptBy::Model)
    }
}

impl<B: Backend> Activations<B> {
    /// Buffers for batches (B, T) in `backend`'s memory ([`Backend::alloc`]), keeping only
    /// every `every`-th block input (`None`: every activation).
    ///
    /// # Errors
    /// As [`Activations::with_checkpointing`], and allocation errors of the backend.
    pub fn in_backend(
        backend: &B,
        config: &GptConfig,
        b: usize,
        t: usize,
        every: Option<usize>,
    ) -> Result<Self> {
        Self::with_backend_memory(
            backend,
            config,
            b,
            t,
            every,
            |_, len| backend.alloc(len),
            KeptBy::Model,
        )
    }

    /// The general constructor: every buffer from `alloc` (as [`Activations::with_memory`]),
    /// zeroed and filled by `backend`'s kernels; the kept block inputs in a buffer from
    /// `alloc` when `kept` is [`KeptBy::Model`], or none (`alloc` is not asked for
    /// [`KEPT_INPUTS`]) when the caller keeps them. When the
    /// backend's kernels need scratch ([`Backend::scratch_len`] is not 0), `alloc` is asked
    /// for it first, with index [`BACKEND_SCRATCH`], and that buffer goes to the backend
    /// ([`Backend::provide_scratch`]) before the backend runs anything.
    ///
    /// # Errors
    /// As [`Activations::with_memory`].
    pub fn with_backend_memory<E: From<GptError>>(
        backend: &B,
        config: &GptConfig,
        b: usize,
        t: usize,
        every: Option<usize>,
        alloc: impl FnMut(usize, usize) -> std::result::Result<Buffer<B::Slice>, E>,
        kept: KeptBy,
    ) -> std::result::Result<Self, E> {
        Self::build(backend, config, b, t, every, alloc, kept, (1, false))
    }

    /// Buffers for one rank of a tensor-parallel group of `tp` ranks (`tp` must divide NH),
    /// in `backend`'s memory, keeping every `every`-th block input with checkpointing (else
    /// every activation): the views of this rank's heads and MLP
    /// columns are `tp` times smaller, and with `vocab` its logits too (see
    /// [`Sizes::split`]).
    ///
    /// # Errors
    /// As [`Activations::in_backend`]; also a `tp` that does not divide NH (or Vp with
    /// `vocab`).
    pub(crate) fn in_backend_split(
        backend: &B,
        config: &GptConfig,
        (b, t): (usize, usize),
        every: Option<usize>,
        tp: usize,
        vocab: bool,
    ) -> Result<Self> {
        let alloc = |_, len| backend.alloc(len);
        Self::build(
            backend,
            config,
            b,
            t,
            every,
            alloc,
            KeptBy::Model,
            (tp, vocab),
        )
    }

    /// [`Activations::with_backend_memory`] sized for a tensor-parallel size and whether
    /// the vocabulary is split, `(tp, vocab)`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn build<E: From<GptError>>(
        backend: &B,
        config: &GptConfig,
        b: usize,
        t: usize,
        every: Option<usize>,
        mut alloc: impl FnMut(usize, usize) -> std::result::Result<Buffer<B::Slice>, E>,
        kept: KeptBy,
        (tp, vocab): (usize, bool),
    ) -> std::result::Result<Self, E> {
        let sizes = Sizes::split(config, b, t, every, tp, vocab)?;
        // Handed over before the backend runs anything, the fills below included; not
        // zeroed (the backend writes its scratch before reading it).
        let scratch_len = backend.scratch_len(config, b, t)?;
        if scratch_len > 0 {
            let scratch = alloc(BACKEND_SCRATCH, scratch_len)?;
            if scratch.floats().len() != scratch_len {
                return Err(GptError::SizeMismatch {
                    what: "backend scratch",
                    expected: scratch_len,
                    got: scratch.floats().len(),
                }
                .into());
            }
            backend.provide_scratch(scratch);
        }
        let mut take = |index: usize, len: usize| -> std::result::Result<Buffer<B::Slice>, E> {
            let mut buf = alloc(index, len)?;
            if buf.floats().len() != len {
                return Err(GptError::SizeMismatch {
                    what: "activation buffer",
                    expected: len,
                    got: buf.floats().len(),
                }
                .into());
            }
            backend.fill(buf.floats_mut(), 0.0);
            Ok(buf)
        };
        let [fwd, saved, grad, n, _, _] = sizes.buffers();
        let nc = n * config.channels;
        let fwd = take(0, fwd)?;
        let kept = match kept {
            KeptBy::Caller => Kept::Caller {
                segments: saved / nc,
                input_len: nc,
                restored: None,
            },
            KeptBy::Model => Kept::local(take(KEPT_INPUTS, saved)?, nc)?,
        };
        let grad = take(2, grad)?;
        let mut dlosses = take(3, n)?;
        backend.fill(dlosses.floats_mut(), 1.0 / n as f32);
        let (tokens, targets) = (take(4, n)?, take(5, n)?);
        Ok(Self {
            b,
            t,
            c: config.channels,
            config: *config,
            tp,
            vocab_parallel: vocab && tp > 1,
            fwd,
            kept,
            grad,
            layer_lens: sizes.layer_lens,
            head_lens: sizes.head_lens,
            grad_lens: sizes.grad_lens,
            every,
            slots: sizes.slots,
            valid_segment: None,
            recompute_next: None,
            recomputing: false,
            dlosses,
            tokens,
            targets,
            progress: Progress::Empty,
        })
    }
}
