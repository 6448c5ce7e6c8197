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

use super::collectives::Collectives;
use super::declared::{confirm_same_schedules, Declared};
use super::engine_ops::EngineOps;
use super::error::{Error, Result};
use super::grad_home::HostGrads;
use super::inflight::{InFlight, Prefetch};
use super::kept::KeptStore;
use super::kernels::Kernels;
use super::loss_scale::LossScaler;
use super::optimizer_home::OffloadedOptimizer;
use super::param_home::{check_param_offload, OffloadedParams};
use super::planning::formulas::{expected_model_state_bytes, ModelStateBytes};
use super::planning::kept_plan::KeptInputs;
use super::planning::offload_plan::OffloadPlan;
use super::planning::plan::{
    arena_config, check_fits, plan_memory, unit_policies, MemoryPlan, PlanShape,
};
use super::planning::policy::{UnitPolicy, ZeroStage};
use super::planning::schedule::Schedule;
use super::planning::traffic_plan::Traffic;
use super::planning::unit::UnitSpec;
use super::precision::Precision;
use super::start::{allocate_units, provide_staging};
use super::unit_buffers::UnitBuffers;
use crate::optim::AdamW;
use std::collections::VecDeque;
use zero_alloc::{Arena, ArenaConfig, Device, Handle};
use zero_comm::{Communicator, StagingRule};

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
    /// Units whose stage-3 all-gathers are launched ahead of use, in the order recorded on
    /// the first step, so they overlap the current unit's compute (`prefetch`).
    pub prefetch_units: usize,
    /// Global gradient-norm clipping threshold (0: off).
    pub grad_clip: f32,
    /// AdamW hyper-parameters.
    pub adam: AdamW,
    /// Cap on the rank's arena in bytes (`None`: exactly what the plan needs).
    pub memory_limit: Option<u64>,
    /// Bytes the model takes from the arena besides model states (its activations, through
    /// [`Engine::lend_f32`]), arena rounding included: planned and capped with the rest.
    pub activation_bytes: u64,
    /// Memory defragmentation (the paper's MD): compact the arena when an allocation finds
    /// no hole although the free bytes would do. Off, such an allocation fails.
    pub defragment: bool,
    /// ZeRO-Offload (`offload_optimizer`): the f32 master weights and Adam's moments in a
    /// host arena of their own, page-locked when the arena is a GPU's, and AdamW on the host
    /// (see the `optimizer_home` module). The cap, `memory_limit`, is the engine arena's.
    pub offload_optimizer: bool,
    /// With `offload_optimizer`: the master weights and moments in one file per rank (the
    /// file tier, `--offload-optimizer nvme`) under [`EngineOps::nvme_path`], streamed
    /// through the host arena piece by piece; the host arena holds only the update's
    /// staging (see the `optimizer_stream` module).
    pub optimizer_file: bool,
    /// With `offload_optimizer`: the reduced gradients this rank keeps live in the host
    /// arena too, accumulated there as each bucket's reduction lands during backward, so the
    /// rank's arena holds no gradient between steps and the update reads them where they
    /// are (see the `grad_home` module); beside `delayed_param_update`, in a host arena of
    /// their own.
    pub offload_gradients: bool,
    /// Bytes of the file tier's pool buffer (rounded up to 4 KiB): a piece larger than it
    /// moves chunk by chunk.
    pub nvme_chunk_bytes: usize,
    /// ZeRO-Infinity's parameter offload (`offload_param`, stage 3 with `offload_optimizer`):
    /// the stored shards of the units stage 3 gathers live off the rank's arena, in a host
    /// arena of their own (page-locked when the arena is a GPU's), and are copied into each
    /// all-gather's buffer when it is launched; the offloaded update reads and writes them
    /// there (see the `param_home` module).
    pub offload_params: bool,
    /// With `offload_params`: those shards in one file per rank under
    /// [`EngineOps::nvme_path`] (`--offload-params nvme`), read piece by piece through a
    /// fixed pool, ahead of their gathers on an I/O thread (`nvme_prefetch_bytes`).
    pub params_file: bool,
    /// With `params_file`: the look-ahead budget of the file's reads, in bytes (DeepSpeed's
    /// `prefetch_bucket_size` / `max_in_cpu` spirit): an I/O thread reads the shards of the
    /// units the running program gathers next into host blocks holding at most this many
    /// bytes, or one shard when a shard is larger (see the `param_read_ahead` module).
    pub nvme_prefetch_bytes: usize,
    /// DeepSpeed's delayed parameter update (with `offload_optimizer` in the host arena):
    /// each step's host AdamW runs on a thread while the next forward and backward run on
    /// the parameters of the step before, one step stale (see the `delayed` module); not
    /// the arithmetic of an engine without it.
    pub delayed_param_update: bool,
    /// Cap on the offloaded tiers' host memory in bytes, the optimizer's host arena, the
    /// gradients' own (beside the delayed update), the offloaded parameters' and the
    /// parameter file's reads ahead together (`None`: exactly what the plan needs); a cap
    /// below the plan is refused at start-up with the bytes needed.
    pub host_memory_limit: Option<u64>,
    /// How the programs' kept inputs (activation checkpointing) are stored: their length,
    /// and whether they live in pinned host memory (ZeRO-R's checkpoint offload).
    pub kept_inputs: KeptInputs,
}

/// The default of [`EngineConfig::nvme_prefetch_bytes`]: 64 MiB of shards read ahead.
pub const DEFAULT_NVME_PREFETCH_BYTES: usize = 64 << 20;

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
            activation_bytes: 0,
            defragment: true,
            offload_optimizer: false,
            optimizer_file: false,
            offload_gradients: false,
            offload_params: false,
            params_file: false,
            nvme_prefetch_bytes: DEFAULT_NVME_PREFETCH_BYTES,
            delayed_param_update: false,
            nvme_chunk_bytes: 1 << 20,
            host_memory_limit: None,
            kept_inputs: KeptInputs::default(),
        }
    }
}

impl EngineConfig {
    /// What the memory plan of an engine with this configuration depends on, on a group of
    /// `world` ranks whose collectives stage as `staging` says: the one mapping from the
    /// knobs to the plan, used by the engine and by planners that run nothing.
    pub fn plan_shape(&self, world: usize, staging: StagingRule) -> PlanShape {
        PlanShape {
            world,
            stage: self.stage,
            precision: self.precision,
            persistence_threshold: self.persistence_threshold,
            prefetch_units: self.prefetch_units,
            reduce_bucket_bytes: self.reduce_bucket_bytes,
            activation_bytes: self.activation_bytes,
            staging,
            offload_optimizer: self.offload_optimizer,
            optimizer_file: self.offload_optimizer && self.optimizer_file,
            offload_gradients: self.offload_optimizer && self.offload_gradients,
            offload_params: self.offload_params,
            params_file: self.offload_params && self.params_file,
            nvme_prefetch_bytes: self.nvme_prefetch_bytes,
            delayed_param_update: self.offload_optimizer && self.delayed_param_update,
            kept_inputs: self.kept_inputs,
            device_arena: false,
        }
    }
}

/// The rank's arena on `device`: the cap's bytes, or exactly the plan's.
fn rank_arena(config: &EngineConfig, device: Device, plan: &MemoryPlan) -> Result<Arena> {
    let capacity = config.memory_limit.unwrap_or(plan.total());
    let capacity = usize::try_from(capacity).unwrap_or(usize::MAX);
    Ok(Arena::new(ArenaConfig {
        device,
        ..arena_config(capacity, config.defragment)
    })?)
}

/// Refuses inconsistent unit specifications, naming the first, and offload configurations
/// that cannot run.
fn check_units(specs: &[UnitSpec], config: &EngineConfig) -> Result<()> {
    for (unit, spec) in specs.iter().enumerate() {
        spec.check()
            .map_err(|message| Error::BadUnit { unit, message })?;
    }
    check_param_offload(config)?;
    super::grad_home::check_grad_offload(config)?;
    super::delayed::check_delayed(config)
}

/// The offloaded tiers `plan` asks for on `device` (files under `nvme`): the optimizer's
/// host arena or file, the parameter shards' home with `config.offload_params`, and the
/// gradients' own host arena when the plan sets them apart.
fn start_offload(
    plan: OffloadPlan,
    config: &EngineConfig,
    (device, nvme): (Device, Option<&std::path::Path>),
    policies: &[UnitPolicy],
    ranks: (usize, usize),
) -> Result<Homes> {
    let optimizer = OffloadedOptimizer::start(plan, config, device, nvme, policies, ranks)?;
    let params = if config.offload_params {
        Some(OffloadedParams::start(
            &plan, config, device, nvme, policies, ranks,
        )?)
    } else {
        None
    };
    let files = config.plan_shape(ranks.1, StagingRule::None).files();
    let grads = HostGrads::start(&plan, files, device)?;
    Ok((Some(optimizer), params, grads))
}

/// The offloaded homes of the optimizer states, the parameter shards and the gradients
/// (when apart), as `start_offload` makes them.
type Homes = (
    Option<OffloadedOptimizer>,
    Option<OffloadedParams>,
    Option<HostGrads>,
);

/// Parameters (shared) and unreduced gradients (mutable) of some units, from
/// [`OpUnits::views`](crate::OpUnits::views), in the order the operation declared them.
pub type UnitViews<'a> = (Vec<&'a [f32]>, Vec<&'a mut [f32]>);

/// The ZeRO engine of one data-parallel rank: its memory and communication, and three parts
/// that own what they hold (the units' buffers, the collectives in flight, the counters).
#[derive(Debug)]
pub struct Engine {
    pub(crate) comm: Communicator,
    /// Declared before `arena` so that it drops first: a flight dropped unlanded waits for
    /// its collective, which must not outlive the arena's memory.
    pub(crate) flights: Flights,
    pub(crate) arena: Arena,
    /// ZeRO-Offload's host arena of optimizer states (`None`: they are in `arena`).
    pub(crate) offloaded: Option<OffloadedOptimizer>,
    /// ZeRO-Infinity's home of the gathered units' parameter shards (`None`: they are in
    /// `arena`).
    pub(crate) offloaded_params: Option<OffloadedParams>,
    /// The offloaded gradients' own host arena (`None`: they are in `arena` or in the
    /// optimizer's host arena; `grad_home`).
    pub(crate) host_grads: Option<HostGrads>,
    /// Every pass over model-state bytes runs through these.
    pub(crate) kernels: Box<dyn Kernels>,
    /// Every collective over model states runs through these.
    pub(crate) collectives: Box<dyn Collectives>,
    pub(crate) config: EngineConfig,
    pub(crate) units: Units,
    pub(crate) memory_plan: MemoryPlan,
    pub(crate) progress: Progress,
    /// The programs declared at start-up, and the call being made.
    pub(crate) declared: Declared,
    /// Bytes lent to the model for good ([`Engine::lend_f32`]), within the declared
    /// [`EngineConfig::activation_bytes`].
    pub(crate) lent_bytes: u64,
    /// The programs' kept inputs (activation checkpointing), in the arena or offloaded.
    pub(crate) kept: KeptStore,
    /// The timeline being recorded ([`Engine::start_trace`]), if any.
    pub(crate) trace: Option<crate::Trace>,
    /// The spans of a delayed update started while recording that landed after the
    /// timeline was taken ([`Engine::take_late_trace`]).
    pub(crate) late_trace: Option<crate::Trace>,
    /// The tensor-parallel group beside this data-parallel one
    /// ([`Engine::with_tensor_parallel`]), if any.
    pub(crate) tp: Option<Communicator>,
    /// The delayed parameter update running on its thread, if any (`delayed`).
    pub(crate) pending_update: Option<super::delayed::Pending>,
}

/// The registered units: what they are, what the stage means for each, and their blocks.
#[derive(Debug)]
pub(crate) struct Units {
    pub specs: Vec<UnitSpec>,
    pub policies: Vec<UnitPolicy>,
    pub bufs: Vec<UnitBuffers>,
}

/// Collectives launched over arena blocks they hold pinned until they land.
#[derive(Debug)]
pub(crate) struct Flights {
    /// Stage 3: all-gathers launched ahead of the units' gathers, one slot per unit.
    pub prefetched: Vec<Option<Prefetch>>,
    /// Gradient reductions launched and not yet accumulated, oldest first.
    pub reductions: VecDeque<InFlight>,
}

impl Flights {
    /// Nothing in flight, for `units` units.
    fn none(units: usize) -> Self {
        Self {
            prefetched: (0..units).map(|_| None).collect(),
            reductions: VecDeque::new(),
        }
    }
}

/// Where training stands: what the next optimizer step applies and what has been moved.
#[derive(Debug)]
pub(crate) struct Progress {
    /// Micro-steps whose gradients are accumulated since the last optimizer step.
    pub micro_steps: u32,
    /// Optimizer steps taken (Adam's t).
    pub steps: u64,
    /// Elements handed to collectives for model states.
    pub traffic: Traffic,
    /// fp16's dynamic loss scale (1 and inert otherwise).
    pub scaler: LossScaler,
}

impl Progress {
    /// Nothing accumulated, stepped or moved yet, with `precision`'s loss scale.
    fn start(precision: Precision) -> Self {
        Self {
            micro_steps: 0,
            steps: 0,
            traffic: Traffic::default(),
            scaler: LossScaler::for_precision(precision),
        }
    }
}

impl Engine {
    /// Registers `specs` on this rank for the passes of `programs` (the schedules of the
    /// model's [`Program`](crate::Program)s: its training micro-step, its forward-only
    /// passes), with model states in host memory. Plans the peak by replaying every
    /// program, allocates every buffer from a fresh arena of that size (or the cap) and fills
    /// the parameters with `init(unit, whole_unit)`, which must give the same values on every
    /// rank (seeded). Every rank must declare the same programs, in the same order; only
    /// declared programs run ([`Engine::micro_step`], [`Engine::forward`]).
    ///
    /// # Errors
    /// [`Error::DoesNotFit`] when the cap is too small (naming a stage that fits),
    /// [`Error::BadUnit`] for inconsistent specs, [`Error::BadProgram`] for a malformed
    /// program or one that differs between ranks, arena and collective errors.
    pub fn new(
        comm: Communicator,
        specs: Vec<UnitSpec>,
        programs: &[&Schedule],
        config: EngineConfig,
        init: impl FnMut(usize, &mut [f32]),
    ) -> Result<Self> {
        Self::with_ops(comm, specs, programs, config, EngineOps::host(), init)
    }

    /// As [`Engine::new`], with model states on `ops.device`, computed on by
    /// `ops.kernels` and moved by `ops.collectives` ([`EngineOps::host`] there). `comm` still
    /// carries the engine's control traffic (schedule agreement, overflow flag, norm
    /// partials).
    ///
    /// # Errors
    /// As [`Engine::new`].
    pub fn with_ops(
        comm: Communicator,
        specs: Vec<UnitSpec>,
        programs: &[&Schedule],
        config: EngineConfig,
        ops: EngineOps,
        mut init: impl FnMut(usize, &mut [f32]),
    ) -> Result<Self> {
        let EngineOps {
            device,
            kernels,
            collectives,
            nvme_path,
        } = ops;
        check_units(&specs, &config)?;
        confirm_same_schedules(&comm, programs)?;
        let shape = PlanShape {
            device_arena: device != Device::Cpu,
            ..config.plan_shape(comm.size(), collectives.staging_rule(&comm))
        };
        let memory_plan = match config.memory_limit {
            Some(limit) => check_fits(&specs, programs, shape, limit)?,
            None => plan_memory(&specs, programs, shape)?,
        };
        let mut arena = rank_arena(&config, device, &memory_plan)?;
        let policies = unit_policies(&specs, shape)?;
        let ranks = (comm.rank(), comm.size());
        let (mut offloaded, mut offloaded_params, mut host_grads) = match memory_plan.offload {
            Some(plan) => {
                let at = (device, nvme_path.as_deref());
                start_offload(plan, &config, at, &policies, ranks)?
            }
            None => (None, None, None),
        };
        let bufs = allocate_units(
            &mut arena,
            kernels.as_ref(),
            (
                offloaded.as_mut(),
                offloaded_params.as_mut(),
                host_grads.as_mut(),
            ),
            &policies,
            &config,
            comm.rank(),
            &mut init,
        )?;
        let kept_count = programs.iter().map(|s| s.kept_inputs()).max().unwrap_or(0);
        let held = programs.iter().map(|s| s.kept_held()).max().unwrap_or(0);
        let kept = KeptStore::new(&mut arena, kept_count, held, config.kept_inputs)?;
        if shape.staging != StagingRule::None {
            provide_staging(&mut arena, &comm, &memory_plan)?;
        }
        let n_units = bufs.len();
        Ok(Self {
            declared: Declared::new(programs.iter().map(|&s| s.clone()).collect()),
            comm,
            arena,
            offloaded,
            offloaded_params,
            host_grads,
            kernels,
            collectives,
            config,
            units: Units {
                specs,
                policies,
                bufs,
            },
            memory_plan,
            progress: Progress::start(config.precision),
            flights: Flights::none(n_units),
            lent_bytes: 0,
            kept,
            trace: None,
            late_trace: None,
            tp: None,
            pending_update: None,
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

    /// The tensor-parallel group beside this data-parallel one
    /// ([`Engine::with_tensor_parallel`]), if any.
    pub fn tensor_parallel(&self) -> Option<&Communicator> {
        self.tp.as_ref()
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
        &self.units.specs
    }

    /// Optimizer steps taken.
    pub fn steps(&self) -> u64 {
        self.progress.steps
    }

    /// Elements handed to collectives for model states since the engine started.
    pub fn traffic(&self) -> Traffic {
        self.progress.traffic
    }

    pub(crate) fn check_unit(&self, unit: usize) -> Result<()> {
        if unit < self.units.specs.len() {
            Ok(())
        } else {
            Err(Error::NoSuchUnit {
                unit,
                units: self.units.specs.len(),
            })
        }
    }

    /// Model-state bytes this rank holds, by kind, measured from its arena blocks wherever
    /// they are: the offloaded optimizer's and parameters' homes included (a file tier's
    /// through its accounting mirror).
    ///
    /// # Errors
    /// Arena failures (a stale handle would be a bug).
    pub fn measured_model_state_bytes(&self) -> Result<ModelStateBytes> {
        let size = |h: Handle| -> Result<f64> { Ok(self.arena.block(h)?.size as f64) };
        let grad_arena = self.grad_arena();
        let grad_size = |h: Handle| -> Result<f64> { Ok(grad_arena.block(h)?.size as f64) };
        let optim = self.optimizer_arena();
        let optim_size = |h: Handle| -> Result<f64> { Ok(optim.block(h)?.size as f64) };
        let mut out = ModelStateBytes::default();
        out.params += self.offloaded_param_bytes()? as f64;
        for (unit, b) in self.units.bufs.iter().enumerate() {
            if !self.params_offloaded(unit) {
                out.params += size(b.params)?;
            }
            out.grads += grad_size(b.grads)?;
            out.optimizer += optim_size(b.m)? + optim_size(b.v)?;
            if let Some(master) = b.master {
                out.optimizer += optim_size(master)?;
            }
        }
        Ok(out)
    }

    /// The paper's formula for this configuration (K = 12 for half precision, 8 for fp32).
    pub fn expected_model_state_bytes(&self) -> ModelStateBytes {
        let psi = self.units.specs.iter().map(|s| s.numel as u64).sum();
        expected_model_state_bytes(psi, self.world(), self.config.stage, self.config.precision)
    }

    /// What the plan reserved: model states, transient unit buffers, activations and the
    /// backend's staging block.
    pub fn memory_plan(&self) -> MemoryPlan {
        self.memory_plan
    }

    /// Bytes of the programs' kept inputs (activation checkpointing), measured: (in the
    /// rank's arena, in pinned host memory when offloaded).
    ///
    /// # Errors
    /// Arena failures (a stale handle would be a bug).
    pub fn kept_input_bytes(&self) -> Result<(u64, u64)> {
        self.kept.bytes(&self.arena)
    }

    /// fp16's current loss scale (1 for other precisions).
    pub fn loss_scale(&self) -> f32 {
        self.progress.scaler.scale
    }
}
