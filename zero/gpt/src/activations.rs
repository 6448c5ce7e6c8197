//! Activation buffers: one flat forward buffer carved by a (B, T)-dependent size table, and one
//! backward scratch buffer reused by every layer.
//!
//! Legend: B batch, T sequence, C channels, NH heads, L layers, N = B*T, Vp padded vocabulary.
//!
//! The forward buffer is laid out unit by unit, `[embed | layer 0 | .. | layer L-1 | head]`,
//! so one layer's activations are contiguous (what activation checkpointing will drop and
//! recompute, or offload, per layer). Each region ends with its output (N,C), so a unit's
//! input is always the last N*C elements before its region.

use super::config::GptConfig;
use super::error::{GptError, Result};

/// Names of a layer region's views, in buffer order (the output `res3` last).
pub const LAYER_VIEWS: [&str; 15] = [
    "ln1", "ln1_mean", "ln1_rstd", "qkv", "atty", "att", "attproj", "res2", "ln2", "ln2_mean",
    "ln2_rstd", "fch", "fch_gelu", "fcproj", "res3",
];

/// Names of the head region's views, in buffer order.
pub const HEAD_VIEWS: [&str; 5] = ["lnf", "lnf_mean", "lnf_rstd", "logits", "losses"];

/// Names of the backward scratch views, in buffer order.
pub const GRAD_VIEWS: [&str; 6] = ["dres", "dln", "datty", "dqkv", "dfch", "dfch_gelu"];

/// Where a forward/backward sequence stands; each unit call checks it, so a call out of order
/// is an error instead of a gradient computed from stale activations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Progress {
    /// Nothing run yet since allocation.
    Empty,
    /// Forward ran up to (not including) unit `next`.
    Forward { next: usize },
    /// The head ran without targets: logits are valid, no loss, no backward possible.
    Logits,
    /// The head ran with targets: the loss is valid and backward may start.
    Loss,
    /// Backward ran down to unit `next + 1`; unit `next` is due.
    Backward { next: usize },
    /// Backward finished.
    Done,
}

/// Activations of one (B, T) batch shape.
#[derive(Debug)]
pub struct Activations {
    pub(crate) b: usize,
    pub(crate) t: usize,
    pub(crate) c: usize,
    /// The model these buffers were sized for; every unit call checks it.
    pub(crate) config: GptConfig,
    /// Forward buffer: `[encoded (N,C) | L x layer region | head region]`.
    pub(crate) fwd: Vec<f32>,
    /// Backward scratch: `[dres (N,C) | dln (N,C) | datty (N,C) | dqkv (N,3C) | dfch (N,4C) |
    /// dfch_gelu (N,4C)]`.
    pub(crate) grad: Vec<f32>,
    pub(crate) layer_lens: [usize; 15],
    pub(crate) head_lens: [usize; 5],
    pub(crate) grad_lens: [usize; 6],
    pub(crate) tokens: Vec<u32>,  // (B,T)
    pub(crate) targets: Vec<u32>, // (B,T)
    pub(crate) dlosses: Vec<f32>, // (B,T), 1/N each: d(mean loss)/d(loss[b,t])
    pub(crate) progress: Progress,
}

impl Activations {
    /// Buffers for batches of `b` sequences of `t` tokens.
    ///
    /// # Errors
    /// [`GptError::BadBatch`] if B or T is 0, T exceeds `max_seq_len`, or the buffers would not
    /// be addressable.
    pub fn new(config: &GptConfig, b: usize, t: usize) -> Result<Self> {
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
        let (c, nh, vp) = (config.channels, config.num_heads, config.padded_vocab_size);
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
        let layer_lens = [
            n * c,      // ln1 (N,C)
            n,          // ln1_mean (N,)
            n,          // ln1_rstd (N,)
            n * 3 * c,  // qkv (N,3C)
            n * c,      // atty (N,C)
            n * nh * t, // att (B,T,NH,T)
            n * c,      // attproj (N,C)
            n * c,      // res2 (N,C)
            n * c,      // ln2 (N,C)
            n,          // ln2_mean (N,)
            n,          // ln2_rstd (N,)
            n * 4 * c,  // fch (N,4C)
            n * 4 * c,  // fch_gelu (N,4C)
            n * c,      // fcproj (N,C)
            n * c,      // res3 (N,C)
        ];
        let head_lens = [
            n * c,  // lnf (N,C)
            n,      // lnf_mean (N,)
            n,      // lnf_rstd (N,)
            n * vp, // logits (N,Vp): logits, then probs, then dlogits
            n,      // losses (N,)
        ];
        let grad_lens = [n * c, n * c, n * c, n * 3 * c, n * 4 * c, n * 4 * c];
        let fwd_len = n * c
            + config.num_layers * layer_lens.iter().sum::<usize>()
            + head_lens.iter().sum::<usize>();
        Ok(Self {
            b,
            t,
            c,
            config: *config,
            fwd: vec![0.0; fwd_len],
            grad: vec![0.0; grad_lens.iter().sum()],
            layer_lens,
            head_lens,
            grad_lens,
            tokens: vec![0; n],
            targets: vec![0; n],
            dlosses: vec![1.0 / n as f32; n],
            progress: Progress::Empty,
        })
    }

    /// B.
    #[must_use]
    pub fn batch(&self) -> usize {
        self.b
    }

    /// T.
    #[must_use]
    pub fn seq_len(&self) -> usize {
        self.t
    }

    /// f32 elements held (forward buffer + backward scratch): the activation memory.
    #[must_use]
    pub fn num_floats(&self) -> usize {
        self.fwd.len() + self.grad.len() + self.dlosses.len()
    }

    /// Per-position losses (B,T) of the last head forward with targets.
    ///
    /// # Errors
    /// [`GptError::OutOfOrder`] before a loss was computed.
    pub fn losses(&self) -> Result<&[f32]> {
        if !matches!(
            self.progress,
            Progress::Loss | Progress::Backward { .. } | Progress::Done
        ) {
            return Err(GptError::OutOfOrder {
                call: "losses",
                reason: "no head forward with targets since the last embed forward".into(),
            });
        }
        let n = self.b * self.t;
        Ok(&self.fwd[self.fwd.len() - n..])
    }

    pub(crate) fn layer_len(&self) -> usize {
        self.layer_lens.iter().sum()
    }

    /// Offset of layer `l`'s region in `fwd`.
    pub(crate) fn layer_offset(&self, l: usize) -> usize {
        self.b * self.t * self.c + l * self.layer_len()
    }

    /// Offset of the head region in `fwd`.
    pub(crate) fn head_offset(&self) -> usize {
        self.fwd.len() - self.head_lens.iter().sum::<usize>()
    }
}
