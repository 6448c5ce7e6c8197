//! The activation size table: every buffer's length for one (B, T) shape and checkpointing
//! option, computed in this one place.
//!
//! Legend: B batch, T sequence, C channels, NH heads, L layers, N = B*T, Vp padded vocabulary.

use crate::config::GptConfig;
use crate::error::{GptError, Result};

/// The sizes of every activation buffer for one (B, T) shape and checkpointing option: the
/// one place the activation memory is computed ([`activation_bytes`] reports it, and
/// [`Activations::new`](crate::Activations::new) allocates exactly it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sizes {
    pub layer_lens: [usize; 15],
    pub head_lens: [usize; 5],
    pub grad_lens: [usize; 6],
    /// Layer regions in the forward buffer: L, or K with checkpointing every K blocks.
    pub slots: usize,
    /// f32 elements of the forward buffer: `[input (N,C) | slots x layer | head]`.
    pub fwd: usize,
    /// f32 elements of the kept block inputs: ceil(L/K) x (N,C), or none.
    pub saved: usize,
    /// f32 elements of the backward scratch.
    pub grad: usize,
    /// Positions N (tokens, targets, dlosses: 4 bytes each).
    pub n: usize,
}

impl Sizes {
    /// Sizes for batches (B, T) of `config`, keeping only every `every`-th block input when
    /// checkpointing (`None`: every activation kept).
    ///
    /// Per layer region 19NC + 4N + NH·N·T; head NC + 4N + N·Vp; scratch 14NC; plus the
    /// input (N,C) and 3N for tokens, targets and dlosses.
    pub fn new(config: &GptConfig, b: usize, t: usize, every: Option<usize>) -> Result<Self> {
        Self::split(config, b, t, every, 1, false)
    }

    /// As [`Sizes::new`] for one rank of a tensor-parallel group of `tp` ranks (`tp` must
    /// divide NH and 4C, [`TpSplit::validate`](crate::TpSplit::validate)): the views of this
    /// rank's heads and MLP columns shrink by `tp` (qkv (N,3C/tp), atty (N,C/tp), att
    /// (B,T,NH/tp,T), fch and fch_gelu (N,4C/tp), and their gradients); every (N,C) view
    /// stays whole. With `vocab` (the vocabulary split too, `tp` dividing Vp) the logits
    /// view holds this rank's (N,Vp/tp) logits followed by its (N,tp+1) loss statistics
    /// (`kernels::vocab_parallel`). At `tp` = 1 exactly [`Sizes::new`].
    pub fn split(
        config: &GptConfig,
        b: usize,
        t: usize,
        every: Option<usize>,
        tp: usize,
        vocab: bool,
    ) -> Result<Self> {
        let n = check_shape(config, b, t, every, tp, vocab)?;
        let (c, nh, vp, l) = (
            config.channels,
            config.num_heads / tp,
            config.padded_vocab_size,
            config.num_layers,
        );
        let layer_lens = [
            n * c,          // ln1 (N,C)
            n,              // ln1_mean (N,)
            n,              // ln1_rstd (N,)
            n * 3 * c / tp, // qkv (N,3C), this rank's heads
            n * c / tp,     // atty (N,C), this rank's heads
            n * nh * t,     // att (B,T,NH,T), nh = this rank's heads
            n * c,          // attproj (N,C)
            n * c,          // res2 (N,C)
            n * c,          // ln2 (N,C)
            n,              // ln2_mean (N,)
            n,              // ln2_rstd (N,)
            n * 4 * c / tp, // fch (N,4C), this rank's columns
            n * 4 * c / tp, // fch_gelu (N,4C), this rank's columns
            n * c,          // fcproj (N,C)
            n * c,          // res3 (N,C)
        ];
        let logits = if vocab && tp > 1 {
            n * vp / tp + n * (tp + 1) // this rank's columns, then the loss statistics
        } else {
            n * vp
        };
        let head_lens = [
            n * c,  // lnf (N,C)
            n,      // lnf_mean (N,)
            n,      // lnf_rstd (N,)
            logits, // logits (N,Vp): logits, then probs, then dlogits
            n,      // losses (N,)
        ];
        let (cw, fw) = (c / tp, 4 * c / tp); // this rank's attention and MLP widths
        let grad_lens = [n * c, n * c, n * cw, n * 3 * cw, n * fw, n * fw];
        let (slots, saved) = match every {
            None => (l, 0),
            Some(k) => (k.min(l), l.div_ceil(k) * n * c),
        };
        Ok(Self {
            layer_lens,
            head_lens,
            grad_lens,
            slots,
            fwd: n * c + slots * layer_lens.iter().sum::<usize>() + head_lens.iter().sum::<usize>(),
            saved,
            grad: grad_lens.iter().sum(),
            n,
        })
    }

    /// Elements of each buffer, in [`BUFFER_NAMES`] order.
    pub fn buffers(&self) -> [usize; 6] {
        [self.fwd, self.saved, self.grad, self.n, self.n, self.n]
    }

    /// Bytes of every activation buffer together.
    pub fn bytes(&self) -> u64 {
        4 * self.buffers().iter().sum::<usize>() as u64
    }
}

/// Refuses a batch shape (B, T), checkpointing option or tensor-parallel split the buffers
/// cannot be sized for; returns N = B*T.
fn check_shape(
    config: &GptConfig,
    b: usize,
    t: usize,
    every: Option<usize>,
    tp: usize,
    vocab: bool,
) -> Result<usize> {
    let bad = |reason| {
        Err(GptError::BadBatch {
            batch: b,
            seq_len: t,
            reason,
        })
    };
    if b == 0 || t == 0 {
        return bad("B and T must be at least 1");
    }
    if t > config.max_seq_len {
        return bad("T exceeds the model's max_seq_len");
    }
    if every == Some(0) {
        return bad("checkpointing every 0 blocks");
    }
    if tp == 0 || config.num_heads % tp != 0 {
        return bad("the tensor-parallel size must divide the heads");
    }
    if vocab && config.padded_vocab_size % tp != 0 {
        return bad("the tensor-parallel size must divide the padded vocabulary");
    }
    let (c, nh, vp) = (
        config.channels,
        config.num_heads / tp,
        config.padded_vocab_size,
    );
    let Some(n) = b.checked_mul(t) else {
        return bad("B*T overflows");
    };
    let largest = n.checked_mul(vp.max(nh * t).max(4 * c));
    if largest
        .and_then(|x| x.checked_mul(16 * (config.num_layers + 2)))
        .is_none()
    {
        return bad("activation buffers overflow usize");
    }
    Ok(n)
}

/// The activation buffers, in the order [`Activations::with_memory`](crate::Activations::with_memory) asks for them (tokens
/// and targets are u32 ids, stored in 4-byte words).
pub const BUFFER_NAMES: [&str; 6] = [
    "forward",
    "kept inputs",
    "backward scratch",
    "dlosses",
    "tokens",
    "targets",
];

/// The index in [`BUFFER_NAMES`] of the kept block inputs (checkpointing): the buffer read
/// only at segment starts, in forward and before recompute, so it may live in slower memory
/// (offloaded to pinned host memory).
pub const KEPT_INPUTS: usize = 1;

/// The index the allocator of [`Activations::with_memory`](crate::Activations::with_memory)
/// is called with, after the [`BUFFER_NAMES`], for the backend's kernel scratch
/// ([`Backend::scratch_len`](crate::Backend::scratch_len) elements), asked for only when
/// that is not 0 (never on the CPU).
pub const BACKEND_SCRATCH: usize = BUFFER_NAMES.len();

/// Elements (4 bytes each) of every activation buffer for one (B, T) micro-batch of
/// `config`, in [`BUFFER_NAMES`] order: what [`Activations::with_memory`](crate::Activations::with_memory) asks for.
///
/// # Errors
/// As [`Activations::new`](crate::Activations::new).
pub fn activation_buffers(
    config: &GptConfig,
    b: usize,
    t: usize,
    every: Option<usize>,
) -> Result<[usize; 6]> {
    Ok(Sizes::new(config, b, t, every)?.buffers())
}

/// Bytes of the activations of one (B, T) micro-batch of `config` on one rank, with
/// checkpointing every `every` blocks or without (`None`): what [`Activations::new`](crate::Activations::new)
/// allocates.
///
/// # Errors
/// As [`Activations::new`](crate::Activations::new).
pub fn activation_bytes(
    config: &GptConfig,
    b: usize,
    t: usize,
    every: Option<usize>,
) -> Result<u64> {
    Ok(Sizes::new(config, b, t, every)?.bytes())
}
