//! The optimizer step: overflow agreement (fp16), global norm from shards, clipping, AdamW
//! on the owned range of the f32 master weights, and the all-gather that brings
//! whole-parameter ranks back in sync.

use super::collectives::InPlace;
use super::engine::Engine;
use super::error::{Error, Result};
use super::kernels::{AdamWBuffers, AdamWStep, Span};
use super::planning::unit::UnitSpec;
use super::precision::{with_store, Precision, Store};
use super::trace::Lane;
use super::transient::free_after;
use crate::optim::{clip_coefficient, global_norm};
use zero_comm::ReduceOp;

/// What one optimizer step did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepReport {
    /// Global gradient norm before clipping (inf when the step overflowed).
    pub grad_norm: f32,
    /// The factor gradients were scaled by (1 when not clipped).
    pub clip_coef: f32,
    /// fp16: the gradients overflowed on some rank and the step was skipped everywhere.
    pub skipped: bool,
    /// The loss scale the step's gradients were computed under.
    pub loss_scale: f32,
}

impl Engine {
    /// One optimizer step over the gradients accumulated since the last one, at learning
    /// rate `lr`. Gradients are averaged over ranks and micro-steps.
    ///
    /// # Errors
    /// No micro-step since the last step, a backward left open, a non-finite gradient norm
    /// (fp32 and bf16; fp16 skips the step instead), collective or arena failures.
    pub fn step(&mut self, lr: f32) -> Result<StepReport> {
        let start = std::time::Instant::now();
        let report = self.step_at(lr)?;
        let steps = self.progress.steps;
        self.trace_span(Lane::Optimizer, start, || format!("step {steps}"));
        Ok(report)
    }

    fn step_at(&mut self, lr: f32) -> Result<StepReport> {
        if self.progress.micro_steps == 0 {
            return Err(Error::Order(
                "step without a finished micro-step (call end_micro_step after backward)".into(),
            ));
        }
        if let Some(u) = self.units.bufs.iter().position(|b| b.unreduced.is_some()) {
            return Err(Error::Order(format!(
                "step while unit {u}'s backward is still open"
            )));
        }
        self.complete_reductions(0)?;
        self.drop_prefetches()?;
        // Before the host reads below (overflow flags, norms), which would block on a
        // collective of a dead peer with no timeout.
        self.collectives.settle()?;
        let loss_scale = self.progress.scaler.scale;
        if self.config.precision == Precision::Fp16 && self.any_rank_overflowed()? {
            self.clear_grads()?;
            self.progress.scaler.update(true);
            if self.rank() == 0 {
                tracing::warn!(
                    loss_scale,
                    "fp16 gradients overflowed on some rank: step skipped on every rank, loss \
                     scale now {}",
                    self.progress.scaler.scale
                );
            }
            return Ok(StepReport {
                grad_norm: f32::INFINITY,
                clip_coef: 0.0,
                skipped: true,
                loss_scale,
            });
        }
        // One factor takes the stored gradients back to the mean over micro-steps, unscaled.
        let factor = 1.0 / (self.progress.micro_steps as f32 * loss_scale);
        let norm = self.global_norm(factor)?;
        if !norm.is_finite() {
            return Err(Error::NonFinite {
                step: self.progress.steps + 1,
                norm,
            });
        }
        let clip = self.config.grad_clip;
        let clip_coef = if clip > 0.0 {
            clip_coefficient(norm, f64::from(clip))
        } else {
            1.0
        };
        self.progress.steps += 1;
        with_store!(self.config.precision, S => self.update_and_sync::<S>(lr, factor, clip_coef))?;
        self.progress.scaler.update(false);
        Ok(StepReport {
            grad_norm: norm as f32,
            clip_coef,
            skipped: false,
            loss_scale,
        })
    }

    /// Agrees across ranks (of both groups beside tensor parallelism) whether any rank saw
    /// an inf or NaN since the last step.
    fn any_rank_overflowed(&mut self) -> Result<bool> {
        let local = self.take_any_overflow()?;
        let mut flag = [if local { 1.0f32 } else { 0.0 }];
        self.comm.all_reduce_in_place(&mut flag, ReduceOp::Max)?;
        if let Some(tp) = &self.tp {
            tp.all_reduce_in_place(&mut flag, ReduceOp::Max)?;
        }
        Ok(flag[0] > 0.0)
    }

    /// Zeroes the accumulated gradients and the micro-step count.
    fn clear_grads(&mut self) -> Result<()> {
        let dtype = self.config.precision.dtype();
        for unit in 0..self.units.bufs.len() {
            let all = self.kept_grads(unit);
            let (arena, kernels) = self.grad_home();
            kernels.fill_zero(arena, dtype, all)?;
        }
        self.progress.micro_steps = 0;
        Ok(())
    }

    /// AdamW on the owned range of every unit (on the f32 master copy for half precision,
    /// rounded back into the stored parameters), then the all-gather where parameters are
    /// kept whole but updated by shard (stages 1-2, persistent units at stage 3).
    fn update_and_sync<S: Store>(&mut self, lr: f32, factor: f32, clip_coef: f32) -> Result<()> {
        if self.config.delayed_param_update {
            return self.delayed_update::<S>(lr, factor, clip_coef);
        }
        // With the optimizer's file tier, one stream reads ahead across the units' updates.
        self.begin_file_step()?;
        let updated = self.update_units::<S>(lr, factor, clip_coef);
        // The update's own failure explains more than a failure to end the stream after it.
        updated.and(self.end_file_step())
    }

    /// [`Engine::update_and_sync`]'s units, one after the other.
    fn update_units<S: Store>(&mut self, lr: f32, factor: f32, clip_coef: f32) -> Result<()> {
        let rank = self.rank();
        for unit in 0..self.units.specs.len() {
            let policy = self.units.policies[unit];
            let segments = self.units.specs[unit].decay_segments();
            let step = AdamWStep {
                adam: self.config.adam,
                t: self.progress.steps,
                lr,
                grad_factor: factor,
                clip_coef,
                offset: policy.owned(rank).offset,
                segments: &segments,
            };
            let start = std::time::Instant::now();
            if self.offloaded.is_some() {
                self.update_offloaded::<S>(unit, &step)?;
            } else {
                self.update_unit::<S>(unit, &step)?;
            }
            self.trace_span(Lane::Optimizer, start, || format!("update unit {unit}"));
            let grads = self.kept_grads(unit);
            let (arena, kernels) = self.grad_home();
            kernels.fill_zero(arena, S::DTYPE, grads)?;
            if policy.syncs_params_after_step() {
                self.sync_params::<S>(unit)?;
            }
            self.read_ahead_after_update(unit)?;
        }
        self.progress.micro_steps = 0;
        Ok(())
    }

    /// The all-gather of `unit`'s updated shards into its whole stored parameters, where
    /// they are whole but updated by shard (stages 1-2, persistent units at stage 3).
    pub(crate) fn sync_params<S: Store>(&mut self, unit: usize) -> Result<()> {
        let start = std::time::Instant::now();
        let flight = self.collectives.launch(
            &self.comm,
            &mut self.arena,
            S::DTYPE,
            InPlace::AllGather,
            self.units.bufs[unit].params,
        )?;
        flight.land(&mut self.arena)?;
        self.trace_span(Lane::Optimizer, start, || format!("all-gather unit {unit}"));
        let policy = self.units.policies[unit];
        self.progress.traffic.all_gather += policy.len(policy.whole_params) as u64;
        Ok(())
    }

    /// AdamW on the range of `unit` this rank owns, in the engine's arena, with a transient
    /// f32 copy of the gradients. The copy's block is not zeroed first: the update writes
    /// every element of it before reading it.
    fn update_unit<S: Store>(&mut self, unit: usize, step: &AdamWStep<'_>) -> Result<()> {
        let (policy, rank) = (self.units.policies[unit], self.rank());
        let owned = policy.owned(rank);
        let grad32 = self.arena.alloc_elems::<f32>(owned.len.max(1))?;
        let b = &self.units.bufs[unit];
        let p_at = policy.part.local(rank, owned, policy.whole_params);
        let g_at = policy.part.local(rank, owned, policy.whole_grads);
        let o_at = policy.part.local(rank, owned, policy.whole_optim);
        let bufs = AdamWBuffers {
            grads: Span::new(b.grads, g_at),
            scratch: Span::new(grad32, 0..owned.len),
            master: b.master.map(|h| Span::new(h, o_at.clone())),
            params: Span::new(b.params, p_at),
            m: Span::new(b.m, o_at.clone()),
            v: Span::new(b.v, o_at),
        };
        let updated = self.kernels.adamw(&mut self.arena, S::DTYPE, &bufs, step);
        free_after(&mut self.arena, grad32, updated)
    }

    /// The global gradient norm over every unit's real elements, of the gradients times
    /// `factor`.
    ///
    /// Each rank's shards are summed in f64 in unit order; the per-rank partial sums are
    /// combined in rank order. Stage 0 computes every rank's partial itself with the same
    /// code, so every stage gets the same norm to the bit. Beside a tensor-parallel group,
    /// the squares of the units that are slices are summed over that group in rank order,
    /// and the others' counted once.
    fn global_norm(&mut self, factor: f32) -> Result<f64> {
        if self.tp.is_none() {
            return Ok(global_norm(&self.dp_partials(factor, |_| true)?));
        }
        let sharded: f64 = self.dp_partials(factor, |s| s.tp_sharded)?.iter().sum();
        let replicated: f64 = self.dp_partials(factor, |s| !s.tp_sharded)?.iter().sum();
        let tp = self.tp.as_ref().expect("checked above");
        let mut all = vec![0f64; tp.size()];
        tp.all_gather(&[sharded], &mut all)?;
        Ok((all.iter().sum::<f64>() + replicated).sqrt())
    }

    /// Every data-parallel rank's sum of squares over the units `keep` selects, in rank
    /// order.
    fn dp_partials(&mut self, factor: f32, keep: fn(&UnitSpec) -> bool) -> Result<Vec<f64>> {
        let world = self.world();
        // Under all-reduce a rank holds every reduced shard; under reduce-scatter only its
        // own (stage 1's whole buffer is reduced only on this rank's shard), so ranks
        // exchange partial sums.
        let holds_all = self
            .units
            .policies
            .iter()
            .all(|p| p.holds_every_reduced_shard());
        if holds_all || world == 1 {
            return (0..world)
                .map(|r| self.partial_norm(r, factor, keep))
                .collect();
        }
        let mine = self.partial_norm(self.rank(), factor, keep)?;
        let mut all = vec![0f64; world];
        self.comm.all_gather(&[mine], &mut all)?;
        Ok(all)
    }

    /// Sum of squares of rank `r`'s shards of the units `keep` selects, as the exchange
    /// sends it (an f64, unchanged), so a partial computed locally equals one received. It
    /// is rounded to the sum of two f32 (about 48 bits) first: that is what partials were
    /// while collectives carried only f32, and keeping it keeps norms, clipping and so every
    /// saved run bitwise as before.
    fn partial_norm(&mut self, r: usize, factor: f32, keep: fn(&UnitSpec) -> bool) -> Result<f64> {
        let sum =
            with_store!(self.config.precision, S => self.sum_of_squares::<S>(r, factor, keep))?;
        Ok(round_to_f32_pair(sum))
    }

    fn sum_of_squares<S: Store>(
        &mut self,
        r: usize,
        factor: f32,
        keep: fn(&UnitSpec) -> bool,
    ) -> Result<f64> {
        let units = self.units.specs.iter().zip(&self.units.policies);
        let spans: Vec<Span> = units
            .zip(&self.units.bufs)
            .filter(|((spec, _), _)| keep(spec))
            .map(|((_, policy), b)| {
                let shard = policy.part.data_shard(r);
                Span::new(b.grads, policy.part.local(r, shard, policy.whole_grads))
            })
            .collect();
        let (arena, kernels) = self.grad_home();
        let mut sum = 0f64;
        for grads in spans {
            sum = kernels.add_squares(arena, S::DTYPE, grads, factor, sum)?;
        }
        Ok(sum)
    }
}

/// `x` rounded to the nearest sum of two f32 `hi + lo` (about 48 significant bits), `hi`
/// being `x` rounded to f32.
fn round_to_f32_pair(x: f64) -> f64 {
    let hi = x as f32;
    let lo = (x - f64::from(hi)) as f32;
    f64::from(hi) + f64::from(lo)
}
