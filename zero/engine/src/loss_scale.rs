//! Dynamic loss scaling for fp16 (DeepSpeed's defaults: initial 2^16, window 1000,
//! hysteresis 2, minimum 1).
//!
//! The model computes its backward in f32; gradients enter half precision when the engine
//! rounds them for the reduction, and that is where the scale is applied (and removed again
//! before the optimizer). A step whose gradients overflowed on any rank is skipped on every
//! rank and the scale lowered; after `window` clean steps it is doubled.

/// The state of the dynamic loss scale.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LossScaler {
    /// The current scale.
    pub scale: f32,
    /// Clean steps before the scale doubles.
    pub window: u32,
    /// Overflows tolerated before the scale halves.
    pub hysteresis: u32,
    /// The scale never goes below this.
    pub min_scale: f32,
    clean_steps: u32,
    hysteresis_left: u32,
}

impl Default for LossScaler {
    fn default() -> Self {
        Self::new(65536.0, 1000, 2, 1.0)
    }
}

impl LossScaler {
    /// A scaler starting at `scale`.
    pub fn new(scale: f32, window: u32, hysteresis: u32, min_scale: f32) -> Self {
        Self {
            scale,
            window: window.max(1),
            hysteresis: hysteresis.max(1),
            min_scale,
            clean_steps: 0,
            hysteresis_left: hysteresis.max(1),
        }
    }

    /// DeepSpeed's defaults for fp16; a fixed scale of 1 (inert) for other precisions.
    pub fn for_precision(precision: crate::Precision) -> Self {
        if precision == crate::Precision::Fp16 {
            Self::default()
        } else {
            Self::new(1.0, u32::MAX, 1, 1.0)
        }
    }

    /// Where the scaler stands between changes: clean steps since the last overflow or
    /// doubling, and overflows still tolerated before the scale halves. With the scale, what
    /// a checkpoint must keep for a resumed run to scale as the uninterrupted one.
    pub fn progress(&self) -> (u32, u32) {
        (self.clean_steps, self.hysteresis_left)
    }

    /// Restores [`LossScaler::progress`] (the overflows tolerated are kept within 1..=hysteresis).
    pub fn set_progress(&mut self, clean_steps: u32, hysteresis_left: u32) {
        self.clean_steps = clean_steps;
        self.hysteresis_left = hysteresis_left.clamp(1, self.hysteresis);
    }

    /// Records a step's outcome and adjusts the scale.
    pub fn update(&mut self, overflow: bool) {
        if overflow {
            self.clean_steps = 0;
            if self.hysteresis_left <= 1 {
                self.scale = (self.scale / 2.0).max(self.min_scale);
            } else {
                self.hysteresis_left -= 1;
            }
        } else {
            self.clean_steps += 1;
            if self.clean_steps % self.window == 0 {
                self.scale *= 2.0;
                self.hysteresis_left = self.hysteresis;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hysteresis_delays_the_first_halving() {
        let mut s = LossScaler::new(1024.0, 1000, 2, 1.0);
        s.update(true);
        assert_eq!(s.scale, 1024.0);
        s.update(true);
        assert_eq!(s.scale, 512.0);
        s.update(true);
        assert_eq!(s.scale, 256.0);
    }

    #[test]
    fn a_clean_window_doubles_the_scale_and_restores_hysteresis() {
        let mut s = LossScaler::new(8.0, 3, 2, 1.0);
        for _ in 0..3 {
            s.update(false);
        }
        assert_eq!(s.scale, 16.0);
        s.update(true);
        assert_eq!(s.scale, 16.0, "hysteresis absorbs one overflow");
    }

    #[test]
    fn the_scale_never_drops_below_the_minimum() {
        let mut s = LossScaler::new(2.0, 1000, 1, 1.0);
        for _ in 0..5 {
            s.update(true);
        }
        assert_eq!(s.scale, 1.0);
    }
}
