//! The engine of one rank: its arena, its communicator, and every unit's buffers.
//!
//! Data flow of one optimizer step, the same for every stage:
//! 1. forward, unit by unit: [`Engine::gather`] (stage 3 all-gathers the unit into a
//!    transient buffer), the model reads [`Engine::params`], [`Engine::release`];
//! 2. backward, in reverse: [`Engine::begin_backward`] gives the unit a zeroed transient
//!    gradient buffer that the model adds into (through [`Engine::views`]), and
//!    [`Engine::end_backward`] reduces it across ranks (all-reduce at stage 0, reduce-scatter
//!    otherwise, both summing every element in rank order) and adds the result into the
//!    persistent gradient (whole at stages 0-1, one shard at stages 2-3);
//! 3. [`Engine::step`]: global norm from per-shard partial sums combined in rank order,
//!    clipping, AdamW on the owned range, and an all-gather of updated shards where
//!    parameters are kept whole (stages 1-2).
//!
//! Every element sees the same arithmetic in the same order at every stage, so stages 0-3
//! give the same parameters to the bit.

use super::error::{EngineError, Result};
use super::memory::{expected_model_state_bytes, ModelStateBytes, Precision, ZeroStage};
use super::order::OrderCheck;
use super::plan::{check_fits, plan_memory, MemoryPlan, UnitPlan, ELEM};
use super::unit::UnitSpec;
use crate::optim::AdamW;
use zero_alloc::{Arena, ArenaConfig, Handle};
use zero_comm::{Communicator, ReduceOp};

/// The engine's knobs, under DeepSpeed's names where it has them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EngineConfig {
    /// Which model states are partitioned (`stage`).
    pub stage: ZeroStage,
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
    /// Parameters: the padded unit, or this rank's shard.
    pub params: Handle,
    /// Reduced gradients accumulated over micro-steps: padded unit or shard.
    pub grads: Handle,
    /// Adam moments: padded unit or shard.
    pub m: Handle,
    pub v: Handle,
    /// Stage 3: the gathered unit, and how many users hold it.
    pub gathered: Option<Handle>,
    pub gather_refs: usize,
    /// During the unit's backward: its unreduced gradient.
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
}

impl Engine {
    /// Registers `specs` on this rank: plans and allocates every buffer from a fresh arena
    /// and fills the parameters with `init(unit, whole_unit)`, which must give the same
    /// values on every rank (seeded).
    ///
    /// # Errors
    /// [`EngineError::DoesNotFit`] when the cap is too small (naming a stage that fits),
    /// [`EngineError::BadUnit`] for inconsistent specs, arena errors.
    pub fn new(
        comm: Communicator,
        specs: Vec<UnitSpec>,
        config: EngineConfig,
        mut init: impl FnMut(usize, &mut [f32]),
    ) -> Result<Self> {
        for (unit, spec) in specs.iter().enumerate() {
            spec.check()
                .map_err(|message| EngineError::BadUnit { unit, message })?;
        }
        let world = comm.size();
        let (stage, keep, prefetch) = (
            config.stage,
            config.persistence_threshold,
            config.prefetch_units,
        );
        let memory_plan = match config.memory_limit {
            Some(limit) => check_fits(&specs, world, stage, keep, prefetch, limit)?,
            None => plan_memory(&specs, world, stage, keep, prefetch)?,
        };
        let capacity = config.memory_limit.unwrap_or(memory_plan.total());
        let capacity = usize::try_from(capacity).unwrap_or(usize::MAX);
        let mut arena = Arena::new(ArenaConfig::new(capacity))?;
        let plans = specs
            .iter()
            .map(|s| UnitPlan::new(s, world, stage, keep))
            .collect::<Result<Vec<_>>>()?;
        let mut bufs = Vec::with_capacity(specs.len());
        for (unit, plan) in plans.iter().enumerate() {
            let params = zeroed(&mut arena, plan.len(plan.whole_params))?;
            let grads = zeroed(&mut arena, plan.len(plan.whole_grads))?;
            let m = zeroed(&mut arena, plan.len(plan.whole_optim))?;
            let v = zeroed(&mut arena, plan.len(plan.whole_optim))?;
            init_unit(&mut arena, plan, params, comm.rank(), |w| init(unit, w))?;
            bufs.push(UnitBuffers {
                params,
                grads,
                m,
                v,
                gathered: None,
                gather_refs: 0,
                unreduced: None,
            });
        }
        arena.reset_peak();
        let order = OrderCheck::new(comm.rank());
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
            Err(EngineError::NoSuchUnit {
                unit,
                units: self.specs.len(),
            })
        }
    }

    /// Makes `unit`'s whole parameters available (stage 3: all-gathers them into a transient
    /// buffer; otherwise a no-op). Balanced by [`Engine::release`]; nested calls share one
    /// buffer.
    ///
    /// # Errors
    /// Unknown unit, a rank visiting units in another order, arena or collective failures.
    pub fn gather(&mut self, unit: usize) -> Result<()> {
        self.check_unit(unit)?;
        self.order.visit(&self.comm, unit)?;
        let plan = self.plans[unit];
        let b = &mut self.bufs[unit];
        if plan.whole_params {
            return Ok(());
        }
        b.gather_refs += 1;
        if b.gathered.is_some() {
            return Ok(());
        }
        let full = self.arena.alloc_elems::<f32>(plan.part.padded_numel())?;
        let (params, mut views) = (b.params, self.arena.views());
        let shard = views.get::<f32>(params)?;
        let whole = views.get_mut::<f32>(full)?;
        self.comm.all_gather(shard, whole)?;
        self.traffic.all_gather += whole.len() as u64;
        b.gathered = Some(full);
        Ok(())
    }

    /// Ends a use begun by [`Engine::gather`]; the last one frees stage 3's buffer.
    ///
    /// # Errors
    /// Unknown unit, or a release without a gather.
    pub fn release(&mut self, unit: usize) -> Result<()> {
        self.check_unit(unit)?;
        if self.plans[unit].whole_params {
            return Ok(());
        }
        let b = &mut self.bufs[unit];
        if b.gather_refs == 0 {
            return Err(EngineError::Order(format!(
                "release of unit {unit} without a matching gather"
            )));
        }
        b.gather_refs -= 1;
        if b.gather_refs == 0 {
            if let Some(full) = b.gathered.take() {
                self.arena.free(full)?;
            }
        }
        Ok(())
    }

    /// The block holding `unit`'s whole parameters right now.
    fn param_block(&self, unit: usize) -> Result<Handle> {
        self.check_unit(unit)?;
        let b = &self.bufs[unit];
        if self.plans[unit].whole_params {
            Ok(b.params)
        } else {
            b.gathered.ok_or(EngineError::NotGathered { unit })
        }
    }

    /// `unit`'s parameters (its `numel` elements, no padding).
    ///
    /// # Errors
    /// [`EngineError::NotGathered`] at stage 3 outside gather/release.
    pub fn params(&self, unit: usize) -> Result<&[f32]> {
        let block = self.param_block(unit)?;
        Ok(&self.arena.slice::<f32>(block)?[..self.specs[unit].numel])
    }

    /// Starts `unit`'s backward: gives it a zeroed buffer for its unreduced gradient.
    ///
    /// # Errors
    /// Unknown unit, a backward already begun, arena failures.
    pub fn begin_backward(&mut self, unit: usize) -> Result<()> {
        self.check_unit(unit)?;
        if self.bufs[unit].unreduced.is_some() {
            return Err(EngineError::Order(format!(
                "begin_backward of unit {unit} twice without end_backward"
            )));
        }
        let h = zeroed(&mut self.arena, self.plans[unit].part.padded_numel())?;
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
                    EngineError::Order(format!("gradients of unit {u} used outside its backward"))
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

    /// Ends `unit`'s backward: reduces its gradient across ranks (average), adds the part
    /// this rank keeps into the accumulated gradient, and frees the transient buffer.
    ///
    /// # Errors
    /// A unit not in backward, a divergent unit order, collective or arena failures.
    pub fn end_backward(&mut self, unit: usize) -> Result<()> {
        self.check_unit(unit)?;
        self.order.visit(&self.comm, unit)?;
        let plan = self.plans[unit];
        let rank = self.comm.rank();
        let tmp = self.bufs[unit].unreduced.take().ok_or_else(|| {
            EngineError::Order(format!(
                "end_backward of unit {unit} without begin_backward"
            ))
        })?;
        let grads = self.bufs[unit].grads;
        {
            let mut views = self.arena.views();
            let tmp = views.get_mut::<f32>(tmp)?;
            let acc = views.get_mut::<f32>(grads)?;
            let shard = plan.part.shard(rank);
            if self.config.stage == ZeroStage::Zero0 {
                self.comm.all_reduce_in_place(tmp, ReduceOp::Avg)?;
                self.traffic.all_reduce += tmp.len() as u64;
                add_into(acc, tmp);
            } else {
                self.comm.reduce_scatter_in_place(tmp, ReduceOp::Avg)?;
                self.traffic.reduce_scatter += tmp.len() as u64;
                let reduced = &tmp[shard.range()];
                if plan.whole_grads {
                    add_into(&mut acc[shard.range()], reduced);
                } else {
                    add_into(acc, reduced);
                }
            }
        }
        self.arena.free(tmp)?;
        Ok(())
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
        }
        Ok(out)
    }

    /// The paper's formula for this configuration (fp32 Adam: K = 8).
    pub fn expected_model_state_bytes(&self) -> ModelStateBytes {
        let psi = self.specs.iter().map(|s| s.numel as u64).sum();
        expected_model_state_bytes(psi, self.world(), self.config.stage, Precision::Fp32)
    }

    /// What the plan reserved: model states plus transient unit buffers.
    pub fn memory_plan(&self) -> MemoryPlan {
        self.memory_plan
    }

    /// Bytes per stored element of model states.
    pub fn element_bytes(&self) -> u64 {
        ELEM
    }
}

/// A zero-filled block of `len` f32 (arena blocks hold stale bytes after reuse).
fn zeroed(arena: &mut Arena, len: usize) -> Result<Handle> {
    let h = arena.alloc_elems::<f32>(len)?;
    arena.slice_mut::<f32>(h)?.fill(0.0);
    Ok(h)
}

/// Writes the initial parameters of one unit into `params` (whole, or this rank's shard).
fn init_unit(
    arena: &mut Arena,
    plan: &UnitPlan,
    params: Handle,
    rank: usize,
    init: impl FnOnce(&mut [f32]),
) -> Result<()> {
    let numel = plan.part.numel();
    if plan.whole_params {
        init(&mut arena.slice_mut::<f32>(params)?[..numel]);
        return Ok(());
    }
    let full = zeroed(arena, plan.part.padded_numel())?;
    {
        let mut views = arena.views();
        let whole = views.get_mut::<f32>(full)?;
        init(&mut whole[..numel]);
        views
            .get_mut::<f32>(params)?
            .copy_from_slice(&whole[plan.part.shard(rank).range()]);
    }
    arena.free(full)?;
    Ok(())
}

/// `acc += x`, element by element (the one accumulation every stage shares).
pub(crate) fn add_into(acc: &mut [f32], x: &[f32]) {
    for (a, &g) in acc.iter_mut().zip(x) {
        *a += g;
    }
}
