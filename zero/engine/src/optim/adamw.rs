//! AdamW with decoupled weight decay, as PyTorch's `torch.optim.AdamW` computes it:
//!
//! ```text
//! p <- p * (1 - lr * wd)                      (only where the segment decays)
//! m <- b1 * m + (1 - b1) * g
//! v <- b2 * v + (1 - b2) * g^2
//! p <- p - (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
//! ```
//!
//! The bias corrections are computed once per call in f64 and rounded to f32, so every
//! element sees the same constants whatever shard it sits in; the per-element arithmetic is
//! f32 and element-wise, so sharded and whole-buffer updates agree bit for bit.

use std::ops::Range;

use crate::error::{Error, Result};

/// A run of a unit's flat buffer (unit coordinates) and whether weight decay applies to it.
/// GPT-2 practice decays matrices and embeddings, not biases or LayerNorm parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecaySegment {
    /// Element range within the unit.
    pub range: Range<usize>,
    /// Apply weight decay here.
    pub decay: bool,
}

/// AdamW hyper-parameters (the learning rate comes per step, from the schedule).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamW {
    /// Decay of the first moment.
    pub beta1: f32,
    /// Decay of the second moment.
    pub beta2: f32,
    /// Added to the denominator.
    pub eps: f32,
    /// Decoupled weight decay, applied where a segment says so.
    pub weight_decay: f32,
}

impl Default for AdamW {
    /// GPT-2 / llm.c settings: beta1 0.9, beta2 0.95, eps 1e-8, weight decay 0.1.
    fn default() -> Self {
        Self {
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
        }
    }
}

impl AdamW {
    /// Checks the hyper-parameters: betas in `[0, 1)`, `eps > 0`, `weight_decay >= 0`.
    ///
    /// # Errors
    /// [`Error::BadHyperParameter`] naming the first setting out of range.
    pub fn validate(&self) -> Result<()> {
        let bad = |what, value: f32, expected| Error::BadHyperParameter {
            what,
            value: f64::from(value),
            expected,
        };
        if !(0.0..1.0).contains(&self.beta1) {
            return Err(bad("beta1", self.beta1, "0 <= beta1 < 1"));
        }
        if !(0.0..1.0).contains(&self.beta2) {
            return Err(bad("beta2", self.beta2, "0 <= beta2 < 1"));
        }
        if self.eps.is_nan() || self.eps <= 0.0 {
            return Err(bad("eps", self.eps, "eps > 0"));
        }
        if self.weight_decay.is_nan() || self.weight_decay < 0.0 {
            return Err(bad("weight_decay", self.weight_decay, "weight_decay >= 0"));
        }
        Ok(())
    }

    /// One AdamW step on a shard that starts at element `offset` of its unit.
    ///
    /// `params`, `grads`, `m`, `v` are the shard's slices (same length). `segments` are in
    /// unit coordinates, sorted and disjoint; they may cover more than the shard (only the
    /// intersection is used). Shard elements covered by no segment (padding) are not touched.
    /// `step` counts from 1.
    ///
    /// # Errors
    /// [`Error::LengthMismatch`], [`Error::SegmentsUnordered`], [`Error::StepZero`], or
    /// [`Error::BadHyperParameter`] (for the settings or a non-finite `lr`).
    #[allow(clippy::too_many_arguments)] // the four buffers and the shard geometry are the point
    pub fn update(
        &self,
        params: &mut [f32],
        grads: &[f32],
        m: &mut [f32],
        v: &mut [f32],
        offset: usize,
        segments: &[DecaySegment],
        step: u64,
        lr: f32,
    ) -> Result<()> {
        self.validate()?;
        let n = params.len();
        if grads.len() != n || m.len() != n || v.len() != n {
            return Err(Error::LengthMismatch {
                params: n,
                grads: grads.len(),
                m: m.len(),
                v: v.len(),
            });
        }
        let c = self.step_constants(step, lr, segments)?;
        let shard = offset..offset.saturating_add(n);
        for s in segments {
            let lo = s.range.start.max(shard.start);
            let hi = s.range.end.min(shard.end);
            if lo >= hi {
                continue;
            }
            let local = lo - offset..hi - offset;
            let k = Coefficients {
                beta1: self.beta1,
                beta2: self.beta2,
                eps: self.eps,
                step: c,
                decay: if s.decay { c.decay_factor } else { 1.0 },
            };
            let (p, g) = (&mut params[local.clone()], &grads[local.clone()]);
            adamw_kernel(p, g, &mut m[local.clone()], &mut v[local], &k);
        }
        Ok(())
    }

    /// The constants every element of step `step` (from 1) at learning rate `lr` shares,
    /// after checking the settings, `step`, `lr` and the order of `segments`: what
    /// [`AdamW::update`] computes once per call, for a device implementation to pass to
    /// its kernel.
    ///
    /// # Errors
    /// [`Error::SegmentsUnordered`], [`Error::StepZero`], or [`Error::BadHyperParameter`].
    pub fn step_constants(
        &self,
        step: u64,
        lr: f32,
        segments: &[DecaySegment],
    ) -> Result<StepConstants> {
        self.validate()?;
        if step == 0 {
            return Err(Error::StepZero);
        }
        if !lr.is_finite() {
            return Err(Error::BadHyperParameter {
                what: "lr",
                value: f64::from(lr),
                expected: "finite",
            });
        }
        let mut prev_end = 0;
        for (index, s) in segments.iter().enumerate() {
            if s.range.start > s.range.end || (index > 0 && s.range.start < prev_end) {
                return Err(Error::SegmentsUnordered {
                    index,
                    start: s.range.start,
                    end: s.range.end,
                });
            }
            prev_end = s.range.end;
        }
        Ok(self.constants(step, lr))
    }

    fn constants(&self, step: u64, lr: f32) -> StepConstants {
        // powi takes i32; beyond 2^31 steps beta^t is 0 in any precision anyway.
        let t = i32::try_from(step).unwrap_or(i32::MAX);
        let bc1 = 1.0 - f64::from(self.beta1).powi(t);
        let bc2 = 1.0 - f64::from(self.beta2).powi(t);
        StepConstants {
            step_size: (f64::from(lr) / bc1) as f32,
            inv_sqrt_bc2: (1.0 / bc2.sqrt()) as f32,
            decay_factor: 1.0 - lr * self.weight_decay,
        }
    }
}

/// Per-call constants shared by every element, rounded once to f32.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepConstants {
    /// `lr / (1 - beta1^t)`.
    pub step_size: f32,
    /// `1 / sqrt(1 - beta2^t)`.
    pub inv_sqrt_bc2: f32,
    /// `1 - lr * weight_decay`: the factor of a decaying segment (1 elsewhere).
    pub decay_factor: f32,
}

/// Elements per parallel task: enough that a task's overhead is noise, few enough that a
/// shard of a few million elements keeps every core of a large host busy.
const TASK_ELEMS: usize = 1 << 16;

/// Everything one segment's elements share: the settings, the step's constants and the
/// segment's decay factor (1 where it does not decay).
struct Coefficients {
    beta1: f32,
    beta2: f32,
    eps: f32,
    step: StepConstants,
    decay: f32,
}

/// The update of one segment's elements, split into tasks on rayon's pool. Each element's
/// arithmetic is [`adamw_serial`]'s whatever task it falls in, so the split changes no bit.
fn adamw_kernel(p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], k: &Coefficients) {
    use rayon::prelude::*;
    if p.len() <= TASK_ELEMS {
        return adamw_serial(p, g, m, v, k);
    }
    p.par_chunks_mut(TASK_ELEMS)
        .zip(g.par_chunks(TASK_ELEMS))
        .zip(m.par_chunks_mut(TASK_ELEMS))
        .zip(v.par_chunks_mut(TASK_ELEMS))
        .for_each(|(((p, g), m), v)| adamw_serial(p, g, m, v, k));
}

/// The per-element update, in f32, as the module documentation writes it (zipped slices, so
/// the loop has no bounds checks and vectorises).
fn adamw_serial(p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], k: &Coefficients) {
    let (b1, b2, c, decay) = (k.beta1, k.beta2, &k.step, k.decay);
    let elements = p.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut());
    for (((p, &gi), m), v) in elements {
        let mi = b1 * *m + (1.0 - b1) * gi;
        let vi = b2 * *v + (1.0 - b2) * gi * gi;
        *m = mi;
        *v = vi;
        let denom = vi.sqrt() * c.inv_sqrt_bc2 + k.eps;
        *p = *p * decay - c.step_size * (mi / denom);
    }
}
