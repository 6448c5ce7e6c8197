//! The engine of one rank: its arena, its communicator, and every unit's buffers.
//!
//! Data flow of one optimizer step, the same for every stage:
//! 1. forward, unit by unit: [`Engine::gather`] makes an f32 copy of the unit's whole
//!    parameters where the stored ones are not that already (stage 3 all-gathers the
//!    shards; half precision widens), the model reads [`Engine::params`], then
//!    [`Engine::release`];
//! 2. backward, in reverse: [`Engine::begin_backward`] gives the unit a zeroed f32 gradient
//!    buffer that the model adds into (through [`Engine::views`]), and
//!    [`Engine::end_backward`] rounds it to the storage type, reduces it across ranks
//!    (all-reduce at stage 0, reduce-scatter otherwise, both summing every element in rank
//!    order) and accumulates the part this rank keeps (whole at stages 0-1, a shard at 2-3);
//! 3. [`Engine::step`]: global norm from per-shard partial sums combined in rank order,
//!    clipping, AdamW on the owned range, and an all-gather of updated shards where
//!    parameters are kept whole (stages 1-2).
//!
//! Every element sees the same arithmetic in the same order at every stage, so stages 0-3
//! give the same parameters to the bit.

use super::error::{Error, Result};
use super::inflight::{InFlight, Prefetch, MAX_IN_FLIGHT};
use super::loss_scale::LossScaler;
use super::memory::{expected_model_state_bytes, ModelStateBytes, Precision, ZeroStage};
use super::order::{OrderCheck, Visit};
use super::plan::{check_fits, plan_memory, MemoryPlan, PlanShape, UnitPlan};
use super::storage::{accumulate, any_non_finite, narrow, widen, with_store, Store};
use super::unit::UnitSpec;
use crate::optim::AdamW;
use std::collections::VecDeque;
use zero_alloc::{Arena, ArenaConfig, Handle};
use zero_comm::{Communicator, ReduceOp};

/// The engine's knobs, under DeepSpeed's names where it has them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EngineConfig {
    /// Which model states are partitioned (`stage`).
    pub stage: ZeroStage,
    /// Storage of parameters and gradients (`fp16` / `bf16` sections).
    pub precision: Precision,
    /// Bytes per gradient bucket (`reduce_bucket_size`): the reduction of a unit is staged
    /// and launched in pieces of this size, so its staging memory is fixed.
    pub reduce_bucket_bytes: usize,
    /// Units with fewer elements keep whole parameters at stage 3
    /// (`param_persistence_threshold`).
    pub persistence_threshold: usize,
    /// Units gathered ahead of use at stage 3 (`prefetch`); planned for, not yet overlapped.
    pub prefetch_units: usize,
    /// Global gradient-norm clipping threshold (0: off).
    pub grad_clip: f32,
    /// AdamW hyper-parameters.
    pub adam: AdamW,
    /// Cap on the rank's arena in bytes (`None`: exactly what the plan needs).
    pub memory_limit: Option<u64>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            stage: ZeroStage::Zero2,
            precision: Precision::Fp32,
            reduce_bucket_bytes: 4 << 20,
            persistence_threshold: 0,
            prefetch_units: 1,
            grad_clip: 1.0,
            adam: AdamW::default(),
            memory_limit: None,
        }
    }
}

/// One unit's arena blocks on this rank.
#[derive(Debug)]
pub(crate) struct UnitBuffers {
    /// Parameters in the storage type: the padded unit, or this rank's shard.
    pub params: Handle,
    /// f32 master weights (half precision only): padded unit or shard, like `m` and `v`.
    pub master: Option<Handle>,
    /// Reduced gradients in the storage type, accumulated over micro-steps: padded unit or
    /// shard.
    pub grads: Handle,
    /// Adam moments (f32): padded unit or shard.
    pub m: Handle,
    pub v: Handle,
    /// The f32 compute copy of the whole unit while gathered, and how many users hold it.
    pub gathered: Option<Handle>,
    pub gather_refs: usize,
    /// During the unit's backward: its unreduced f32 gradient.
    pub unreduced: Option<Handle>,
}

/// Elements this rank has handed to each kind of collective for model states.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Elements all-reduced.
    pub all_reduce: u64,
    /// Elements reduce-scattered (whole arrays).
    pub reduce_scatter: u64,
    /// Elements all-gathered (whole arrays).
    pub all_gather: u64,
}

impl Traffic {
    /// Paper accounting: an all-reduce moves 2x its array, the others 1x.
    pub fn elements(&self) -> u64 {
        2 * self.all_reduce + self.reduce_scatter + self.all_gather
    }
}

/// Parameters (shared) and unreduced gradients (mutable) of some units, from
/// [`Engine::views`], in the order the units were asked for.
pub type UnitViews<'a> = (Vec<&'a [f32]>, Vec<&'a mut [f32]>);

/// The ZeRO engine of one data-parallel rank.
#[derive(Debug)]
pub struct Engine {
    pub(crate) comm: Communicator,
    pub(crate) arena: Arena,
    pub(crate) config: EngineConfig,
    pub(crate) specs: Vec<UnitSpec>,
    pub(crate) plans: Vec<UnitPlan>,
    pub(crate) bufs: Vec<UnitBuffers>,
    pub(crate) memory_plan: MemoryPlan,
    /// Micro-steps whose gradients are accumulated since the last optimizer step.
    pub(crate) micro_steps: u32,
    /// Optimizer steps taken (Adam's t).
    pub(crate) steps: u64,
    pub(crate) traffic: Traffic,
    pub(crate) order: OrderCheck,
    /// Stage 3: all-gathers launched ahead of the units' `gather` calls.
    pub(crate) prefetched: Vec<Option<Prefetch>>,
    /// Gradient reductions launched and not yet accumulated, oldest first.
    pub(crate) in_flight: VecDeque<InFlight>,
    /// fp16's dynamic loss scale (1 and inert otherwise).
    pub(crate) scaler: LossScaler,
    /// An inf or NaN reached this rank's reduced gradients since the last step.
    pub(crate) overflow: bool,
}

impl Engine {
    /// Registers `specs` on this rank: plans and allocates every buffer from a fresh arena
    /// and fills the parameters with `init(unit, whole_unit)`, which must give the same
    /// values on every rank (seeded).
    ///
    /// # Errors
    /// [`Error::DoesNotFit`] when the cap is too small (naming a stage that fits),
    /// [`Error::BadUnit`] for inconsistent specs, arena errors.
    pub fn new(
        comm: Communicator,
        specs: Vec<UnitSpec>,
        config: EngineConfig,
        mut init: impl FnMut(usize, &mut [f32]),
    ) -> Result<Self> {
        for (unit, spec) in specs.iter().enumerate() {
            spec.check()
                .map_err(|message| Error::BadUnit { unit, message })?;
        }
        let shape = PlanShape {
            world: comm.size(),
            stage: config.stage,
            precision: config.precision,
            persistence_threshold: config.persistence_threshold,
            prefetch_units: config.prefetch_units,
            reduce_bucket_bytes: config.reduce_bucket_bytes,
        };
        let memory_plan = match config.memory_limit {
            Some(limit) => check_fits(&specs, shape, limit)?,
            None => plan_memory(&specs, shape)?,
        };
        let capacity = config.memory_limit.unwrap_or(memory_plan.total());
        let capacity = usize::try_from(capacity).unwrap_or(usize::MAX);
        let mut arena = Arena::new(ArenaConfig::new(capacity))?;
        let plans = specs
            .iter()
            .map(|s| UnitPlan::new(s, shape.world, shape.stage, shape.persistence_threshold))
            .collect::<Result<Vec<_>>>()?;
        let precision = config.precision;
        let mut bufs = Vec::with_capacity(specs.len());
        for (unit, plan) in plans.iter().enumerate() {
            let b = with_store!(precision, S => UnitBuffers {
                params: zeroed::<S>(&mut arena, plan.len(plan.whole_params))?,
                master: if precision.has_master() {
                    Some(zeroed::<f32>(&mut arena, plan.len(plan.whole_optim))?)
                } else {
                    None
                },
                grads: zeroed::<S>(&mut arena, plan.len(plan.whole_grads))?,
                m: zeroed::<f32>(&mut arena, plan.len(plan.whole_optim))?,
                v: zeroed::<f32>(&mut arena, plan.len(plan.whole_optim))?,
                gathered: None,
                gather_refs: 0,
                unreduced: None,
            });
            let values = initial_values(&mut arena, plan, |w| init(unit, w))?;
            let loaded = write_whole(&mut arena, plan, &b, precision, comm.rank(), values);
            arena.free(values)?;
            loaded?;
            bufs.push(b);
        }
        arena.reset_peak();
        let n_units = bufs.len();
        let order = OrderCheck::new(comm.rank());
        let scaler = if precision == Precision::Fp16 {
            LossScaler::default()
        } else {
            LossScaler::new(1.0, u32::MAX, 1, 1.0)
        };
        Ok(Self {
            comm,
            arena,
            config,
            specs,
            plans,
            bufs,
            memory_plan,
            micro_steps: 0,
            steps: 0,
            traffic: Traffic::default(),
            order,
            prefetched: (0..n_units).map(|_| None).collect(),
            in_flight: VecDeque::new(),
            scaler,
            overflow: false,
        })
    }

    /// This rank in the data-parallel group.
    pub fn rank(&self) -> usize {
        self.comm.rank()
    }

    /// Ranks in the data-parallel group.
    pub fn world(&self) -> usize {
        self.comm.size()
    }

    /// The communicator, for collectives outside model states (loss averaging, ...).
    pub fn comm(&self) -> &Communicator {
        &self.comm
    }

    /// The rank's arena (statistics, peak).
    pub fn arena(&self) -> &Arena {
        &self.arena
    }

    /// The configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Registered units.
    pub fn units(&self) -> &[UnitSpec] {
        &self.specs
    }

    /// Optimizer steps taken.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Elements handed to collectives for model states since the engine started.
    pub fn traffic(&self) -> Traffic {
        self.traffic
    }

    pub(crate) fn check_unit(&self, unit: usize) -> Result<()> {
        if unit < self.specs.len() {
            Ok(())
        } else {
            Err(Error::NoSuchUnit {
                unit,
                units: self.specs.len(),
            })
        }
    }

    /// True when the model can read the stored parameters directly (whole f32).
    fn reads_stored(&self, unit: usize) -> bool {
        self.plans[unit].whole_params && !self.config.precision.has_master()
    }

    /// Makes `unit`'s whole parameters available in f32: stage 3 all-gathers the shards,
    /// half precision widens; whole f32 parameters need nothing. Balanced by
    /// [`Engine::release`]; nested calls share one copy.
    ///
    /// # Errors
    /// Unknown unit, a rank visiting units in another order, arena or collective failures.
    pub fn gather(&mut self, unit: usize) -> Result<()> {
        self.check_unit(unit)?;
        self.order.visit(&self.comm, unit, Visit::Gather)?;
        if self.reads_stored(unit) {
            return Ok(());
        }
        let b = &mut self.bufs[unit];
        b.gather_refs += 1;
        if b.gathered.is_some() {
            return Ok(());
        }
        let copy = match self.prefetched[unit].take() {
            Some(prefetch) => prefetch.finish(self)?,
            None => with_store!(self.config.precision, S => self.compute_copy::<S>(unit))?,
        };
        self.bufs[unit].gathered = Some(copy);
        with_store!(self.config.precision, S => self.launch_prefetches::<S>())
    }

    /// A new f32 block holding `unit`'s whole (padded) parameters.
    fn compute_copy<S: Store>(&mut self, unit: usize) -> Result<Handle> {
        let plan = self.plans[unit];
        let padded = plan.part.padded_numel();
        let params = self.bufs[unit].params;
        let out = self.arena.alloc_elems::<f32>(padded)?;
        let staged = if plan.whole_params {
            None
        } else {
            Some(self.arena.alloc_elems::<S>(padded)?)
        };
        let result = (|| -> Result<()> {
            let mut views = self.arena.views();
            let stored = views.get::<S>(params)?;
            let out = views.get_mut::<f32>(out)?;
            let whole: &[S] = match staged {
                None => stored,
                Some(h) => {
                    let staged = views.get_mut::<S>(h)?;
                    self.comm.all_gather(stored, staged)?;
                    self.traffic.all_gather += padded as u64;
                    staged
                }
            };
            widen(whole, out, 1.0);
            Ok(())
        })();
        if let Some(h) = staged {
            self.arena.free(h)?;
        }
        match result {
            Ok(()) => Ok(out),
            Err(e) => {
                self.arena.free(out)?;
                Err(e)
            }
        }
    }

    /// Stage 3: launches the all-gathers of the next `prefetch_units` units of the recorded
    /// order, so they arrive while the current unit computes. Every rank follows the same
    /// recorded order, so every rank launches the same collectives in the same sequence.
    fn launch_prefetches<S: Store>(&mut self) -> Result<()> {
        if self.config.stage != ZeroStage::Zero3 {
            return Ok(());
        }
        let rank = self.comm.rank();
        for unit in self.order.upcoming_gathers(self.config.prefetch_units) {
            let plan = self.plans[unit];
            let b = &self.bufs[unit];
            if plan.whole_params || b.gathered.is_some() || self.prefetched[unit].is_some() {
                continue;
            }
            let padded = plan.part.padded_numel();
            let staged = self.arena.alloc_elems::<S>(padded)?;
            let params = b.params;
            {
                // In-place all-gather: this rank's input is its own chunk.
                let mut views = self.arena.views();
                let shard = views.get::<S>(params)?;
                views.get_mut::<S>(staged)?[plan.part.shard(rank).range()].copy_from_slice(shard);
            }
            let lent = self.arena.lend::<S>(staged)?;
            self.traffic.all_gather += padded as u64;
            let work = self.comm.all_gather_async(lent);
            self.prefetched[unit] = Some(Prefetch::new(work));
        }
        Ok(())
    }

    /// Waits for prefetches that were never used (a step that ended early) and frees them.
    pub(crate) fn drop_prefetches(&mut self) -> Result<()> {
        for unit in 0..self.prefetched.len() {
            if let Some(p) = self.prefetched[unit].take() {
                let copy = p.finish(self)?;
                self.arena.free(copy)?;
            }
        }
        Ok(())
    }

    /// Ends a use begun by [`Engine::gather`]; the last one frees the compute copy.
    ///
    /// # Errors
    /// Unknown unit, or a release without a gather.
    pub fn release(&mut self, unit: usize) -> Result<()> {
        self.check_unit(unit)?;
        if self.reads_stored(unit) {
            return Ok(());
        }
        let b = &mut self.bufs[unit];
        if b.gather_refs == 0 {
            return Err(Error::Order(format!(
                "release of unit {unit} without a matching gather"
            )));
        }
        b.gather_refs -= 1;
        if b.gather_refs == 0 {
            if let Some(copy) = b.gathered.take() {
                self.arena.free(copy)?;
            }
        }
        Ok(())
    }

    /// The f32 block holding `unit`'s whole parameters right now.
    fn param_block(&self, unit: usize) -> Result<Handle> {
        self.check_unit(unit)?;
        if self.reads_stored(unit) {
            return Ok(self.bufs[unit].params);
        }
        self.bufs[unit].gathered.ok_or(Error::NotGathered { unit })
    }

    /// `unit`'s parameters in f32 (its `numel` elements, no padding).
    ///
    /// # Errors
    /// [`Error::NotGathered`] outside gather/release where a copy is needed.
    pub fn params(&self, unit: usize) -> Result<&[f32]> {
        let block = self.param_block(unit)?;
        Ok(&self.arena.slice::<f32>(block)?[..self.specs[unit].numel])
    }

    /// Starts `unit`'s backward: gives it a zeroed f32 buffer for its unreduced gradient.
    ///
    /// # Errors
    /// Unknown unit, a backward already begun, arena failures.
    pub fn begin_backward(&mut self, unit: usize) -> Result<()> {
        self.check_unit(unit)?;
        if self.bufs[unit].unreduced.is_some() {
            return Err(Error::Order(format!(
                "begin_backward of unit {unit} twice without end_backward"
            )));
        }
        let h = zeroed::<f32>(&mut self.arena, self.plans[unit].part.padded_numel())?;
        self.bufs[unit].unreduced = Some(h);
        Ok(())
    }

    /// Parameters of `param_units` and unreduced gradients of `grad_units`, all at once, for
    /// a model's backward call (e.g. the tied LM head reads two units and writes two).
    ///
    /// # Errors
    /// A unit not gathered or not in backward, or a gradient unit listed twice.
    pub fn views(&mut self, param_units: &[usize], grad_units: &[usize]) -> Result<UnitViews<'_>> {
        let params = param_units
            .iter()
            .map(|&u| Ok((self.param_block(u)?, self.specs[u].numel)))
            .collect::<Result<Vec<_>>>()?;
        let grads = grad_units
            .iter()
            .map(|&u| {
                self.check_unit(u)?;
                let h = self.bufs[u].unreduced.ok_or_else(|| {
                    Error::Order(format!("gradients of unit {u} used outside its backward"))
                })?;
                Ok((h, self.specs[u].numel))
            })
            .collect::<Result<Vec<_>>>()?;
        let mut views = self.arena.views();
        let mut p = Vec::with_capacity(params.len());
        for (h, n) in params {
            p.push(&views.get::<f32>(h)?[..n]);
        }
        let mut g = Vec::with_capacity(grads.len());
        for (h, n) in grads {
            g.push(&mut views.get_mut::<f32>(h)?[..n]);
        }
        Ok((p, g))
    }

    /// Ends `unit`'s backward: rounds its gradient to the storage type (scaled by fp16's loss
    /// scale) into buckets and launches their reduction across ranks (average) on the
    /// communicator's progress thread, so it overlaps the backward of the units before it. The reduced part
    /// this rank keeps is accumulated when the reduction completes: by a later call once it
    /// is done, when more than [`MAX_IN_FLIGHT`] are pending, or at [`Engine::step`].
    ///
    /// # Errors
    /// A unit not in backward, a divergent unit order, collective or arena failures (of this
    /// reduction or of an earlier one completed here).
    pub fn end_backward(&mut self, unit: usize) -> Result<()> {
        self.check_unit(unit)?;
        self.order.visit(&self.comm, unit, Visit::Reduce)?;
        let tmp = self.bufs[unit].unreduced.take().ok_or_else(|| {
            Error::Order(format!(
                "end_backward of unit {unit} without begin_backward"
            ))
        })?;
        with_store!(self.config.precision, S => self.launch_reduce::<S>(unit, tmp))
    }

    /// Launches the reduction of `unit`'s gradient `tmp` (f32, the model's buffer) in
    /// buckets of at most `reduce_bucket_bytes`, then frees `tmp`.
    ///
    /// Bucket k holds, for every rank j, the k-th piece of rank j's shard (segment j), so one
    /// in-place reduce-scatter leaves this rank exactly its piece, and an all-reduce (stage 0)
    /// every piece: shards stay contiguous whatever the bucket size, and the staging memory is
    /// a few buckets whatever the unit size. Each element is still summed in rank order, so
    /// the bucket size never changes a bit of the result.
    fn launch_reduce<S: Store>(&mut self, unit: usize, tmp: Handle) -> Result<()> {
        let result = self.launch_buckets::<S>(unit, tmp);
        self.arena.free(tmp)?;
        result
    }

    fn launch_buckets<S: Store>(&mut self, unit: usize, tmp: Handle) -> Result<()> {
        let part = self.plans[unit].part;
        let (world, shard_len) = (part.world(), part.shard_len());
        let piece = (self.config.reduce_bucket_bytes / std::mem::size_of::<S>() / world).max(1);
        let scale = self.scaler.scale;
        for offset in (0..shard_len).step_by(piece) {
            let len = piece.min(shard_len - offset);
            let staged = self.arena.alloc_elems::<S>(world * len)?;
            let packed = (|| -> Result<()> {
                let mut views = self.arena.views();
                let wide = views.get::<f32>(tmp)?;
                let bucket = views.get_mut::<S>(staged)?;
                for (j, segment) in bucket.chunks_exact_mut(len).enumerate() {
                    let at = part.shard(j).offset + offset;
                    narrow(&wide[at..at + len], segment, scale);
                }
                Ok(())
            })();
            if let Err(e) = packed {
                self.arena.free(staged)?;
                return Err(e);
            }
            let lent = self.arena.lend::<S>(staged)?;
            let work = if self.config.stage == ZeroStage::Zero0 {
                self.traffic.all_reduce += (world * len) as u64;
                self.comm.all_reduce_async(lent, ReduceOp::Avg)
            } else {
                self.traffic.reduce_scatter += (world * len) as u64;
                self.comm.reduce_scatter_async(lent, ReduceOp::Avg)
            };
            self.in_flight
                .push_back(InFlight::new(unit, offset, len, work));
            self.complete_reductions(MAX_IN_FLIGHT)?;
        }
        Ok(())
    }

    /// Completes pending reductions, oldest first: all that are done, and more until at most
    /// `keep` remain.
    pub(crate) fn complete_reductions(&mut self, keep: usize) -> Result<()> {
        while let Some(front) = self.in_flight.front() {
            if self.in_flight.len() <= keep && !front.is_done() {
                break;
            }
            if let Some(pending) = self.in_flight.pop_front() {
                pending.finish(self)?;
            }
        }
        Ok(())
    }

    /// Accumulates a completed bucket of `unit` (pieces `[offset, offset + len)` of every
    /// shard, in `staged`) into the gradient this rank keeps.
    pub(crate) fn accumulate_reduced<S: Store>(
        &mut self,
        unit: usize,
        staged: Handle,
        offset: usize,
        len: usize,
    ) -> Result<()> {
        let plan = self.plans[unit];
        let rank = self.comm.rank();
        let grads = self.bufs[unit].grads;
        let result = (|| -> Result<()> {
            let mut views = self.arena.views();
            let bucket = views.get::<S>(staged)?;
            let acc = views.get_mut::<S>(grads)?;
            // (segment, where it goes in the accumulated gradient)
            let mut add = |j: usize, at: usize| {
                let piece = &bucket[j * len..(j + 1) * len];
                self.overflow |= any_non_finite(piece);
                accumulate(&mut acc[at..at + len], piece);
            };
            if self.config.stage == ZeroStage::Zero0 {
                for j in 0..plan.part.world() {
                    add(j, plan.part.shard(j).offset + offset);
                }
            } else if plan.whole_grads {
                add(rank, plan.part.shard(rank).offset + offset);
            } else {
                add(rank, offset);
            }
            Ok(())
        })();
        self.arena.free(staged)?;
        result
    }

    /// Marks the end of one micro-step's backward (for gradient accumulation).
    pub fn end_micro_step(&mut self) {
        self.micro_steps += 1;
    }

    /// Model-state bytes this rank holds, by kind, measured from its arena blocks.
    ///
    /// # Errors
    /// Arena failures (a stale handle would be a bug).
    pub fn measured_model_state_bytes(&self) -> Result<ModelStateBytes> {
        let size = |h: Handle| -> Result<f64> { Ok(self.arena.block(h)?.size as f64) };
        let mut out = ModelStateBytes::default();
        for b in &self.bufs {
            out.params += size(b.params)?;
            out.grads += size(b.grads)?;
            out.optimizer += size(b.m)? + size(b.v)?;
            if let Some(master) = b.master {
                out.optimizer += size(master)?;
            }
        }
        Ok(out)
    }

    /// The paper's formula for this configuration (K = 12 for half precision, 8 for fp32).
    pub fn expected_model_state_bytes(&self) -> ModelStateBytes {
        let psi = self.specs.iter().map(|s| s.numel as u64).sum();
        expected_model_state_bytes(psi, self.world(), self.config.stage, self.config.precision)
    }

    /// What the plan reserved: model states plus transient unit buffers.
    pub fn memory_plan(&self) -> MemoryPlan {
        self.memory_plan
    }

    /// fp16's current loss scale (1 for other precisions).
    pub fn loss_scale(&self) -> f32 {
        self.scaler.scale
    }
}

/// A zero-filled block of `len` elements (arena blocks hold stale bytes after reuse).
pub(crate) fn zeroed<T: bytemuck::Pod>(arena: &mut Arena, len: usize) -> Result<Handle> {
    let h = arena.alloc_elems::<T>(len)?;
    arena.slice_mut::<T>(h)?.fill(T::zeroed());
    Ok(h)
}

/// A transient f32 block holding a unit's whole (padded) initial values.
fn initial_values(
    arena: &mut Arena,
    plan: &UnitPlan,
    init: impl FnOnce(&mut [f32]),
) -> Result<Handle> {
    let full = zeroed::<f32>(arena, plan.part.padded_numel())?;
    init(&mut arena.slice_mut::<f32>(full)?[..plan.part.numel()]);
    Ok(full)
}

/// Stores whole f32 `values` (padded) into a unit's buffers as its stage keeps them: the
/// stored parameters (rounded for half precision) and the f32 master copy.
pub(crate) fn write_whole(
    arena: &mut Arena,
    plan: &UnitPlan,
    b: &UnitBuffers,
    precision: Precision,
    rank: usize,
    values: Handle,
) -> Result<()> {
    let shard = plan.part.shard(rank);
    let mut views = arena.views();
    let values = views.get::<f32>(values)?;
    let part = |whole: bool| {
        if whole {
            values
        } else {
            &values[shard.range()]
        }
    };
    with_store!(precision, S => {
        let stored = views.get_mut::<S>(b.params)?;
        narrow(part(plan.whole_params), stored, 1.0);
    });
    if let Some(master) = b.master {
        views
            .get_mut::<f32>(master)?
            .copy_from_slice(part(plan.whole_optim));
    }
    Ok(())
}
