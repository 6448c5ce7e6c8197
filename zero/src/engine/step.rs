//! The optimizer step: global norm from shards, clipping, AdamW on the owned range, and the
//! all-gather that brings whole-parameter ranks back in sync.

use super::error::{EngineError, Result};
use super::memory::ZeroStage;
use super::partition::Shard;
use super::state::Engine;
use crate::optim::{clip_coefficient, global_norm, sum_of_squares, DecaySegment};

/// What one optimizer step did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepReport {
    /// Global gradient norm before clipping.
    pub grad_norm: f32,
    /// The factor gradients were scaled by (1 when not clipped).
    pub clip_coef: f32,
}

impl Engine {
    /// Runs forward-only work (evaluation, sampling) outside the recorded unit order.
    pub fn without_order_check<R>(&mut self, f: impl FnOnce(&mut Self) -> R) -> R {
        let was = std::mem::replace(&mut self.order.enabled, false);
        let out = f(self);
        self.order.enabled = was;
        out
    }

    /// One optimizer step over the gradients accumulated since the last one, at learning
    /// rate `lr`. Gradients are averaged over ranks and micro-steps.
    ///
    /// # Errors
    /// No micro-step since the last step, a backward left open, a non-finite gradient norm,
    /// collective or arena failures.
    pub fn step(&mut self, lr: f32) -> Result<StepReport> {
        if self.micro_steps == 0 {
            return Err(EngineError::Order(
                "step without a finished micro-step (call end_micro_step after backward)".into(),
            ));
        }
        if let Some(u) = self.bufs.iter().position(|b| b.unreduced.is_some()) {
            return Err(EngineError::Order(format!(
                "step while unit {u}'s backward is still open"
            )));
        }
        self.order.end_step()?;
        if self.micro_steps > 1 {
            self.scale_owned_grads(1.0 / self.micro_steps as f32)?;
        }
        let norm = self.global_norm()?;
        if !norm.is_finite() {
            return Err(EngineError::NonFinite {
                step: self.steps + 1,
                norm,
            });
        }
        let clip = self.config.grad_clip;
        let clip_coef = if clip > 0.0 {
            clip_coefficient(norm, f64::from(clip))
        } else {
            1.0
        };
        if clip_coef < 1.0 {
            self.scale_owned_grads(clip_coef)?;
        }
        self.steps += 1;
        self.update_and_sync(lr)?;
        self.micro_steps = 0;
        Ok(StepReport {
            grad_norm: norm as f32,
            clip_coef,
        })
    }

    /// The range of `unit` this rank updates: everything at stage 0, its shard otherwise.
    fn owned(&self, unit: usize) -> Shard {
        let part = self.plans[unit].part;
        if self.config.stage == ZeroStage::Zero0 {
            Shard {
                offset: 0,
                len: part.numel(),
            }
        } else {
            part.data_shard(self.rank())
        }
    }

    /// Where a buffer kept whole (`true`) or sharded starts, in unit coordinates.
    fn base(&self, unit: usize, whole: bool) -> usize {
        if whole {
            0
        } else {
            self.plans[unit].part.shard(self.rank()).offset
        }
    }

    /// Multiplies the owned gradients by `factor`, element by element.
    fn scale_owned_grads(&mut self, factor: f32) -> Result<()> {
        for unit in 0..self.specs.len() {
            let owned = self.owned(unit);
            let base = self.base(unit, self.plans[unit].whole_grads);
            let g = self.arena.slice_mut::<f32>(self.bufs[unit].grads)?;
            for x in &mut g[owned.offset - base..owned.end() - base] {
                *x *= factor;
            }
        }
        Ok(())
    }

    /// AdamW on the owned range of every unit, then the all-gather where parameters are kept
    /// whole but updated by shard (stages 1-2, persistent units at stage 3).
    fn update_and_sync(&mut self, lr: f32) -> Result<()> {
        let (t, adam) = (self.steps, self.config.adam);
        for unit in 0..self.specs.len() {
            let plan = self.plans[unit];
            let owned = self.owned(unit);
            let local = |whole: bool| {
                let base = self.base(unit, whole);
                owned.offset - base..owned.end() - base
            };
            let (p_at, g_at, o_at) = (
                local(plan.whole_params),
                local(plan.whole_grads),
                local(plan.whole_optim),
            );
            let segments: Vec<DecaySegment> = self.specs[unit]
                .segments(Shard {
                    offset: 0,
                    len: plan.part.numel(),
                })
                .into_iter()
                .map(|(s, decay)| DecaySegment {
                    range: s.range(),
                    decay,
                })
                .collect();
            let b = &self.bufs[unit];
            let (params, grads, m, v) = (b.params, b.grads, b.m, b.v);
            let mut views = self.arena.views();
            let p = views.get_mut::<f32>(params)?;
            let g = views.get_mut::<f32>(grads)?;
            let m = views.get_mut::<f32>(m)?;
            let v = views.get_mut::<f32>(v)?;
            adam.update(
                &mut p[p_at],
                &g[g_at],
                &mut m[o_at.clone()],
                &mut v[o_at],
                owned.offset,
                &segments,
                t,
                lr,
            )?;
            g.fill(0.0);
            if plan.whole_params && self.config.stage != ZeroStage::Zero0 {
                self.comm.all_gather_in_place(p)?;
                self.traffic.all_gather += p.len() as u64;
            }
        }
        Ok(())
    }

    /// The global gradient norm over every unit's real elements.
    ///
    /// Each rank's shards are summed in f64 in unit order; the per-rank partial sums are
    /// combined in rank order. Stage 0 computes every rank's partial itself with the same
    /// code, so every stage gets the same norm to the bit.
    fn global_norm(&mut self) -> Result<f64> {
        let world = self.world();
        // Stage 0 holds every reduced shard; the others hold only their own (stage 1's whole
        // buffer is reduced only on this rank's shard) and exchange partial sums.
        let partials: Vec<f64> = if self.config.stage == ZeroStage::Zero0 || world == 1 {
            (0..world)
                .map(|r| self.partial_norm(r))
                .collect::<Result<_>>()?
        } else {
            let mine = self.partial_norm(self.rank())?;
            let (hi, lo) = split_f64(mine);
            let mut all = vec![0f32; 2 * world];
            self.comm.all_gather(&[hi, lo], &mut all)?;
            all.chunks_exact(2)
                .map(|c| f64::from(c[0]) + f64::from(c[1]))
                .collect()
        };
        Ok(global_norm(&partials))
    }

    /// Sum of squares of rank `r`'s shards, rounded through the (hi, lo) f32 pair that the
    /// exchange sends, so a partial computed locally equals one received.
    fn partial_norm(&self, r: usize) -> Result<f64> {
        let mut sum = 0f64;
        for (plan, b) in self.plans.iter().zip(&self.bufs) {
            let data = plan.part.data_shard(r);
            let base = if plan.whole_grads {
                0
            } else {
                plan.part.shard(r).offset
            };
            let g = self.arena.slice::<f32>(b.grads)?;
            sum += sum_of_squares(&g[data.offset - base..data.end() - base]);
        }
        let (hi, lo) = split_f64(sum);
        Ok(f64::from(hi) + f64::from(lo))
    }
}

/// An f64 as the sum of two f32 (about 48 significant bits), since collectives carry f32.
fn split_f64(x: f64) -> (f32, f32) {
    let hi = x as f32;
    (hi, (x - f64::from(hi)) as f32)
}
