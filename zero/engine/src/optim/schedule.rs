//! Learning-rate schedule: linear warm-up, then cosine decay to a floor (llm.c, nanoGPT).

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Linear warm-up over `warmup_steps`, cosine decay to `max_lr * min_lr_frac` at
/// `total_steps`, and the floor after that. Steps count from 0.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CosineSchedule {
    /// Peak learning rate.
    pub max_lr: f32,
    /// Steps of linear warm-up.
    pub warmup_steps: u64,
    /// Step at which the floor is reached.
    pub total_steps: u64,
    /// Floor as a fraction of `max_lr`, in `[0, 1]`.
    pub min_lr_frac: f32,
}

impl CosineSchedule {
    /// Checks `max_lr >= 0` and finite, `min_lr_frac` in `[0, 1]`, `warmup <= total`.
    ///
    /// # Errors
    /// [`Error::BadHyperParameter`] naming the setting.
    pub fn validate(&self) -> Result<()> {
        if !self.max_lr.is_finite() || self.max_lr < 0.0 {
            return Err(Error::BadHyperParameter {
                what: "max_lr",
                value: f64::from(self.max_lr),
                expected: "finite, >= 0",
            });
        }
        if !(0.0..=1.0).contains(&self.min_lr_frac) {
            return Err(Error::BadHyperParameter {
                what: "min_lr_frac",
                value: f64::from(self.min_lr_frac),
                expected: "0 <= min_lr_frac <= 1",
            });
        }
        if self.warmup_steps > self.total_steps {
            return Err(Error::BadHyperParameter {
                what: "warmup_steps",
                value: self.warmup_steps as f64,
                expected: "warmup_steps <= total_steps",
            });
        }
        Ok(())
    }

    /// The learning rate of `step` (0-based). During warm-up it is
    /// `max_lr * (step + 1) / warmup_steps`, so step 0 already learns (as llm.c does) and
    /// step `warmup_steps - 1` reaches `max_lr`.
    pub fn lr(&self, step: u64) -> f32 {
        let max_lr = f64::from(self.max_lr);
        let min_lr = max_lr * f64::from(self.min_lr_frac);
        if step < self.warmup_steps {
            return (max_lr * (step + 1) as f64 / self.warmup_steps as f64) as f32;
        }
        if step >= self.total_steps {
            return min_lr as f32;
        }
        let ratio =
            (step - self.warmup_steps) as f64 / (self.total_steps - self.warmup_steps) as f64;
        let coeff = 0.5 * (1.0 + (std::f64::consts::PI * ratio).cos());
        (min_lr + coeff * (max_lr - min_lr)) as f32
    }
}
