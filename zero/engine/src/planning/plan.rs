//! Where every buffer of a rank goes, and how many bytes that takes, before anything is
//! allocated: so a configuration that cannot fit fails at start-up, naming a stage that would.
//!
//! The plan is the step's peak, not a bound: model states, the model's activations and the
//! backend's staging block are fixed, and the transient buffers are counted by replaying the
//! declared schedule ([`Replay`]).

use super::formulas::ModelStateBytes;
use super::kept_plan::KeptInputs;
use super::offload_plan::{
    file_slots_bytes, piece_elems, plan_delayed, plan_offload, plan_param_offload, plan_read_ahead,
    OffloadPlan,
};
use super::policy::{UnitPolicy, ZeroStage};
use super::replay::Replay;
use super::schedule::Schedule;
use super::unit::UnitSpec;
use crate::error::{Error, Result};
use crate::precision::Precision;
use zero_alloc::tier::TIER_ALIGN;
use zero_alloc::{ArenaConfig, Backing, Device};
use zero_comm::{ShardBuckets, StagingRule};

/// The bytes one rank needs for a configuration.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MemoryPlan {
    /// Persistent model states in the rank's arena, by kind.
    pub model_states: ModelStateBytes,
    /// The peak of the transient buffers (compute copies, unreduced gradients, prefetched
    /// all-gathers, gradient buckets, the optimizer's f32 gradient).
    pub transient: u64,
    /// The model's own bytes in the arena (activations), as declared.
    pub activations: u64,
    /// The kept inputs' blocks in the arena: each kept input, or the staging slots when
    /// they are offloaded; partitioned, each slice (unless offloaded) and the whole-input
    /// buffers ([`KeptInputs`]).
    pub kept_inputs: u64,
    /// Offloaded kept inputs in pinned host memory (outside the arena and [`total`](Self::total)).
    pub kept_inputs_host: u64,
    /// The block lent to the communicator's backend to stage collectives in (0 for a backend
    /// that stages nothing), sized for [`MemoryPlan::largest_collective`].
    pub backend_staging: u64,
    /// Bytes of the largest collective the engine issues (whole arrays).
    pub largest_collective: u64,
    /// ZeRO-Offload's host tier (`None` without offload); `model_states.optimizer` is then 0,
    /// since the optimizer states are there, and with parameter offload
    /// `model_states.params` leaves out the gathered units' shards, which are there too.
    pub offload: Option<OffloadPlan>,
}

impl MemoryPlan {
    /// Everything the rank's arena holds at the step's peak.
    pub fn total(&self) -> u64 {
        self.model_states.total() as u64
            + self.transient
            + self.activations
            + self.kept_inputs
            + self.backend_staging
    }
}

/// What one rank's planning depends on besides the units and their schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanShape {
    /// Data-parallel ranks.
    pub world: usize,
    /// The ZeRO stage.
    pub stage: ZeroStage,
    /// Storage precision of parameters and gradients.
    pub precision: Precision,
    /// Units smaller than this keep whole parameters at stage 3.
    pub persistence_threshold: usize,
    /// Units gathered ahead at stage 3.
    pub prefetch_units: usize,
    /// Bytes per gradient bucket.
    pub reduce_bucket_bytes: usize,
    /// The model's activation bytes in the arena (0 when it keeps them elsewhere).
    pub activation_bytes: u64,
    /// How the communicator's backend stages collectives
    /// ([`Communicator::staging_rule`](zero_comm::Communicator::staging_rule)).
    pub staging: StagingRule,
    /// ZeRO-Offload: the optimizer states and their update in a host arena of their own.
    pub offload_optimizer: bool,
    /// With `offload_optimizer`: the states in the file tier, the host arena holding only
    /// the update's staging.
    pub optimizer_file: bool,
    /// With `offload_optimizer`: the reduced gradients this rank keeps in the host arena.
    pub offload_gradients: bool,
    /// ZeRO-Infinity's parameter offload (stage 3, with `offload_optimizer`): the stored
    /// shards of the units stage 3 gathers off the arena.
    pub offload_params: bool,
    /// With `offload_params`: those shards in the rank's parameter file rather than a host
    /// arena.
    pub params_file: bool,
    /// With `params_file`: the look-ahead budget of the file's reads, in bytes.
    pub nvme_prefetch_bytes: usize,
    /// With `offload_optimizer`: the delayed parameter update's host blocks of each unit's
    /// owned gradients and parameters.
    pub delayed_param_update: bool,
    /// How the programs' kept inputs are stored.
    pub kept_inputs: KeptInputs,
    /// The rank's arena is a device's (a GPU's): with `offload_gradients`, a landed bucket's
    /// segment is copied into a host landing block before it is added
    /// (`OffloadPlan::landing`).
    pub device_arena: bool,
}

impl PlanShape {
    /// Whether a file tier is on (the optimizer's or the parameters').
    pub fn files(&self) -> bool {
        self.optimizer_file || self.params_file
    }
}

/// The configuration of a rank's arena of `capacity` bytes: the one place its alignment
/// (and so every block's rounding) is chosen.
pub(crate) fn arena_config(capacity: usize, defragment: bool) -> ArenaConfig {
    ArenaConfig::new(capacity).defragment_on_fragmentation(defragment)
}

/// Bytes a block of `bytes` takes in a rank's arena.
pub(crate) fn block_bytes(bytes: u64) -> Result<u64> {
    block_bytes_in(&arena_config(0, true), bytes)
}

/// The configuration of the host arena the parameter file's reads ahead land in: its blocks
/// aligned to whole [`TIER_ALIGN`] blocks, so the file's direct I/O reads into them straight,
/// without the tier pool's copy, on any disk that asks at most that alignment of memory.
pub(crate) fn read_ahead_arena_config(capacity: usize) -> ArenaConfig {
    arena_config(capacity, false).alignment(TIER_ALIGN)
}

/// Bytes a block of `bytes` takes in the reads ahead's arena.
pub(crate) fn read_ahead_block_bytes(bytes: u64) -> Result<u64> {
    block_bytes_in(&read_ahead_arena_config(0), bytes)
}

/// The configuration of the offloaded optimizer's host arena: with a file tier on
/// ([`PlanShape::files`]), aligned as the reads ahead's arena is, so the pieces it moves to
/// and from a file (the update's staging and slots, the delayed update's parameter blocks)
/// go straight, without the tier pool's copy; otherwise a rank arena's alignment.
pub(crate) fn optimizer_host_config(capacity: usize, files: bool) -> ArenaConfig {
    match files {
        true => read_ahead_arena_config(capacity),
        false => arena_config(capacity, false),
    }
}

/// The backing of a host arena beside a rank's arena on `device`: plain memory on the CPU,
/// registered with the GPU's context on a GPU, so copies between the two go by DMA.
pub(crate) fn host_backing(device: Device) -> Backing {
    match device {
        Device::Cpu => Backing::Memory,
        Device::Cuda(ordinal) => Backing::CudaRegistered(ordinal),
    }
}

/// Bytes a block of `bytes` takes in the offloaded optimizer's host arena.
pub(crate) fn optimizer_host_block_bytes(bytes: u64, files: bool) -> Result<u64> {
    block_bytes_in(&optimizer_host_config(0, files), bytes)
}

fn block_bytes_in(config: &ArenaConfig, bytes: u64) -> Result<u64> {
    usize::try_from(bytes)
        .ok()
        .and_then(|b| config.block_size(b))
        .map(|b| b as u64)
        .ok_or_else(|| {
            Error::Order(format!(
                "a block of {bytes} bytes overflows the address space"
            ))
        })
}

/// What the stage means for each of `specs` on one rank shaped as `shape`.
///
/// # Errors
/// A partition error (zero ranks, overflow).
pub(crate) fn unit_policies(specs: &[UnitSpec], shape: PlanShape) -> Result<Vec<UnitPolicy>> {
    specs
        .iter()
        .map(|s| {
            UnitPolicy::new(
                s,
                shape.world,
                shape.stage,
                shape.precision,
                shape.persistence_threshold,
            )
        })
        .collect()
}

/// Plans the buffers of `specs` on one rank for passes that make the calls of any of
/// `schedules` (a program's [`Program::schedule`](crate::Program::schedule): the training
/// micro-step, a forward-only pass).
///
/// Model states come from `model_state_bytes`, the same sum the padded formula uses; the
/// transient peak is the highest of replaying each schedule and the optimizer step
/// (`replay::Replay`).
///
/// # Errors
/// A partition error (zero ranks, overflow), a malformed schedule.
pub fn plan_memory(
    specs: &[UnitSpec],
    schedules: &[&Schedule],
    shape: PlanShape,
) -> Result<MemoryPlan> {
    let policies = unit_policies(specs, shape)?;
    // The optimizer step's own peak, with or without programs. (State import and export
    // hold one whole f32 unit at a time, which a program gathering every unit covers.)
    let mut transient = Replay::new(&policies, shape).peak_of_step(&[])?;
    for schedule in schedules {
        schedule.check(specs.len()).map_err(Error::BadProgram)?;
        transient = transient.max(Replay::new(&policies, shape).peak_of_step(schedule.calls())?);
    }
    let largest_collective = largest_collective_bytes(&policies, shape)?;
    let staging = shape.staging.bytes(largest_collective).ok_or_else(|| {
        Error::Order(format!(
            "staging for collectives of {largest_collective} bytes overflows"
        ))
    })?;
    let kept = schedules.iter().map(|s| s.kept_inputs()).max().unwrap_or(0);
    if kept > 0 && shape.kept_inputs.len == 0 {
        return Err(Error::BadProgram(format!(
            "the programs keep {kept} inputs, but their length (kept_inputs.len) is 0"
        )));
    }
    let held = schedules.iter().map(|s| s.kept_held()).max().unwrap_or(0);
    let (kept_inputs, kept_inputs_host) = shape.kept_inputs.bytes(kept, held)?;
    let (model_states, offload) = plan_model_states(&policies, shape)?;
    Ok(MemoryPlan {
        model_states,
        transient,
        activations: shape.activation_bytes,
        kept_inputs,
        kept_inputs_host,
        backend_staging: if staging == 0 {
            0
        } else {
            block_bytes(staging)?
        },
        largest_collective,
        offload,
    })
}

/// Model-state bytes in the rank's arena, and the offloaded tiers' (`None` without offload):
/// the optimizer states leave the arena with `offload_optimizer`, the kept gradients with
/// `offload_gradients`, the gathered units' parameter shards with `offload_params`.
fn plan_model_states(
    policies: &[UnitPolicy],
    shape: PlanShape,
) -> Result<(ModelStateBytes, Option<OffloadPlan>)> {
    let mut model_states = model_state_bytes(policies, shape.precision);
    if !shape.offload_optimizer {
        return Ok((model_states, None));
    }
    model_states.optimizer = 0.0;
    let mut offload = plan_offload(policies, shape)?;
    if shape.offload_gradients {
        model_states.grads = 0.0;
    }
    if shape.delayed_param_update {
        let (blocks, scratch) = plan_delayed(policies, shape)?;
        let slots = match shape.optimizer_file {
            true => {
                let piece = piece_elems(shape.reduce_bucket_bytes, shape.precision);
                file_slots_bytes(policies, shape.precision, piece)?
            }
            false => 0,
        };
        (offload.delayed, offload.staging) = (blocks, scratch.saturating_add(slots));
    }
    if shape.offload_params {
        let elem = shape.precision.param_bytes() as f64;
        let offloaded = policies.iter().filter(|p| p.gathered());
        model_states.params -= offloaded.map(|p| p.len(false) as f64 * elem).sum::<f64>();
        (offload.params, offload.params_file) = plan_param_offload(
            policies,
            shape.precision,
            shape.reduce_bucket_bytes,
            shape.params_file,
        )?;
        if shape.params_file {
            offload.params_read_ahead =
                plan_read_ahead(policies, shape.precision, shape.nvme_prefetch_bytes)?;
        }
    }
    Ok((model_states, Some(offload)))
}

/// Bytes of the largest collective the engine issues for units kept as `policies` say:
/// a gradient bucket; a stage-3 all-gather of a unit's parameters, or the all-gather after
/// the step at stages 1-2 (storage type); the f32 all-gathers of a sharded unit's states in
/// a checkpoint export; and the exchange of partial gradient norms (two f32 per rank).
/// Everything else the engine or a trainer reduces (the overflow flag, the loss) is one f32.
pub(crate) fn largest_collective_bytes(policies: &[UnitPolicy], shape: PlanShape) -> Result<u64> {
    let elem = shape.precision.param_bytes();
    let overflow = || Error::Order("a collective's bytes overflow".into());
    let mut largest = (2 * shape.world as u64)
        .checked_mul(4)
        .ok_or_else(overflow)?;
    for p in policies {
        let padded = p.part.padded_numel() as u64;
        let buckets = ShardBuckets::new(
            p.part.world(),
            p.part.shard_len(),
            shape.reduce_bucket_bytes / elem as usize,
        )?;
        let bucket = buckets.max_bucket_elems() as u64;
        largest = largest.max(bucket.checked_mul(elem).ok_or_else(overflow)?);
        if p.gathered() || p.syncs_params_after_step() {
            largest = largest.max(padded.checked_mul(elem).ok_or_else(overflow)?);
        }
        if !p.whole_params || !p.whole_optim {
            largest = largest.max(padded.checked_mul(4).ok_or_else(overflow)?);
        }
    }
    Ok(largest)
}

/// Model-state bytes a rank stores for units kept as `policies` say: whole buffers hold the
/// padded unit, sharded ones one shard.
pub(crate) fn model_state_bytes(policies: &[UnitPolicy], precision: Precision) -> ModelStateBytes {
    let mut states = ModelStateBytes::default();
    for p in policies {
        let count = |whole| p.len(whole) as f64;
        states.params += count(p.whole_params) * precision.param_bytes() as f64;
        states.grads += count(p.whole_grads) * precision.grad_bytes() as f64;
        // K bytes: m and v, plus the f32 master weights for half precision.
        states.optimizer += count(p.whole_optim) * precision.optimizer_bytes() as f64;
    }
    states
}

/// Checks `stage` against a memory cap; on failure names the lowest stage that fits.
///
/// # Errors
/// [`Error::DoesNotFit`](crate::error::Error::DoesNotFit).
pub fn check_fits(
    specs: &[UnitSpec],
    schedules: &[&Schedule],
    shape: PlanShape,
    limit: u64,
) -> Result<MemoryPlan> {
    let stage = shape.stage;
    let plan = |stage| plan_memory(specs, schedules, PlanShape { stage, ..shape });
    let wanted = plan(stage)?;
    if wanted.total() <= limit {
        return Ok(wanted);
    }
    let mut hint = None;
    for s in ZeroStage::ALL {
        let need = plan(s)?.total();
        if need <= limit {
            hint = Some(format!("{s} fits ({need} bytes)"));
            break;
        }
    }
    let hint = hint.unwrap_or_else(|| {
        let best = plan(ZeroStage::Zero3)
            .map(|p| p.total())
            .unwrap_or(u64::MAX);
        format!("no stage fits at this world size (stage 3 needs {best} bytes): add ranks")
    });
    Err(crate::error::Error::DoesNotFit {
        stage,
        needed: wanted.total(),
        limit,
        hint,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Units of 1000 and 512 elements: over 4 ranks, shards of 256 and 128, padded to 1024
    /// and 512.
    fn units() -> Vec<UnitSpec> {
        vec![UnitSpec::new("a", 1000), UnitSpec::new("b", 64 * 8)]
    }

    fn shape(stage: ZeroStage) -> PlanShape {
        PlanShape {
            world: 4,
            stage,
            precision: Precision::Fp32,
            persistence_threshold: 0,
            prefetch_units: 1,
            reduce_bucket_bytes: 1 << 20,
            activation_bytes: 0,
            staging: StagingRule::None,
            offload_optimizer: false,
            optimizer_file: false,
            offload_gradients: false,
            offload_params: false,
            params_file: false,
            nvme_prefetch_bytes: 0,
            delayed_param_update: false,
            kept_inputs: KeptInputs::default(),
            device_arena: false,
        }
    }

    fn plan(stage: ZeroStage) -> MemoryPlan {
        plan_memory(&units(), &[&Schedule::sequential(2)], shape(stage)).unwrap()
    }

    #[test]
    fn each_stage_needs_less_than_the_one_before() {
        let need: Vec<f64> = ZeroStage::ALL
            .iter()
            .map(|&s| plan(s).model_states.total())
            .collect();
        assert!(need.windows(2).all(|w| w[1] < w[0]), "{need:?}");
    }

    #[test]
    fn stage_three_replays_prefetches_beside_the_buckets() {
        // Backward of unit 1 (b): its copy 2048 + the prefetch of unit 0 4096 + its gradient
        // 2048 + its bucket 2048 = 10240; then unit 0: the prefetch became its copy (4096),
        // its gradient 4096, unit 1's bucket still in flight 2048, its own bucket 4096
        // = 14336, the peak. States: 4 ranks' shards of 384 elements, 16 bytes each.
        let p = plan(ZeroStage::Zero3);
        assert_eq!(p.transient, 14336);
        assert_eq!(p.total(), 6144 + 14336);
    }

    #[test]
    fn a_tight_cap_names_the_lowest_stage_that_fits() {
        // Stage 1: params and grads whole (1536 x 4 each), m and v a shard (384 x 8) = 15360;
        // no compute copies (whole f32); the peak is unit 0's backward: its gradient 4096,
        // its bucket 4096 and unit 1's bucket 2048 still in flight = 10240.
        let stage1 = plan(ZeroStage::Zero1).total();
        assert_eq!(stage1, 15360 + 10240);
        let schedule = Schedule::sequential(2);
        let err = check_fits(&units(), &[&schedule], shape(ZeroStage::Zero0), stage1).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("stage 1 fits (25600 bytes)"), "{msg}");
        assert!(msg.contains("34816"), "stage 0 needs 24576 + 10240: {msg}");
        assert!(check_fits(&units(), &[&schedule], shape(ZeroStage::Zero1), stage1).is_ok());
    }

    #[test]
    fn the_largest_collective_is_the_largest_unit_or_bucket_the_stage_moves() {
        let largest = |stage, bucket_bytes| {
            let shape = PlanShape {
                reduce_bucket_bytes: bucket_bytes,
                ..shape(stage)
            };
            plan_memory(&units(), &[&Schedule::sequential(2)], shape)
                .unwrap()
                .largest_collective
        };
        // Stage 0 only all-reduces buckets: unit a's whole 1024 f32 in one 1 MiB bucket.
        assert_eq!(largest(ZeroStage::Zero0, 1 << 20), 4096);
        // 1 KiB buckets: 256 elements, 64 per rank.
        assert_eq!(largest(ZeroStage::Zero0, 1024), 1024);
        // Stages 1-3 all-gather unit a (after the step, or before use, or to export it).
        for stage in [ZeroStage::Zero1, ZeroStage::Zero2, ZeroStage::Zero3] {
            assert_eq!(largest(stage, 1024), 4096, "{stage}");
        }
    }

    #[test]
    fn a_staging_backend_adds_one_block_to_the_plan() {
        let copies = PlanShape {
            staging: StagingRule::Copies {
                ranks: 4,
                floor_bytes: 0,
            },
            ..shape(ZeroStage::Zero3)
        };
        let with = plan_memory(&units(), &[&Schedule::sequential(2)], copies).unwrap();
        let without = plan(ZeroStage::Zero3);
        // Collectives up to 4096 bytes over 4 ranks: input 4096, output 4096, mine 1024 and
        // counts 64 bytes = 9280, a block of 9472 in 256-byte arena blocks.
        assert_eq!(with.backend_staging, 9472);
        assert_eq!(with.total(), without.total() + 9472);
        assert_eq!(without.backend_staging, 0);
    }

    /// Shards of 256 and 128 f32 a rank (1024 and 512 bytes, each a whole 4 KiB block
    /// among the reads ahead, for direct I/O): the reads ahead take the budget, at least
    /// the larger shard, at most both.
    #[test]
    fn the_parameter_files_reads_ahead_are_planned_within_the_budget() {
        let read_ahead = |budget: usize, params_file: bool| {
            let s = PlanShape {
                offload_optimizer: true,
                offload_params: true,
                params_file,
                nvme_prefetch_bytes: budget,
                ..shape(ZeroStage::Zero3)
            };
            let p = plan_memory(&units(), &[&Schedule::sequential(2)], s).unwrap();
            let offload = p.offload.unwrap();
            assert_eq!(
                offload.total(),
                offload.optimizer_arena() + offload.params + offload.params_read_ahead
            );
            offload.params_read_ahead
        };
        assert_eq!(read_ahead(0, true), 4096);
        assert_eq!(read_ahead(4096, true), 4096);
        assert_eq!(read_ahead(4097, true), 8192);
        assert_eq!(read_ahead(1 << 20, true), 8192);
        assert_eq!(
            read_ahead(1 << 20, false),
            0,
            "the host tier reads nothing ahead"
        );
    }

    #[test]
    fn a_malformed_schedule_is_refused() {
        let bad = Schedule::new(vec![crate::Call::Gather(0)]);
        let err = plan_memory(&units(), &[&bad], shape(ZeroStage::Zero0)).unwrap_err();
        assert!(matches!(err, Error::BadProgram(_)), "{err}");
    }

    /// With the gradients offloaded from a device's arena, a landed segment goes through a
    /// host block of the largest piece any bucket lands: here 4 ranks, 1 KiB buckets of f32
    /// (256 elements, 64 per rank), so 64 elements of 4 bytes in a 256-byte block; it sits
    /// beside the gradients in their own arena beside the delayed update, and shares the
    /// optimizer's arena's transient room with the update's staging otherwise.
    #[test]
    fn a_device_arena_lands_gradients_through_one_host_block() {
        let at = |device_arena, delayed_param_update| {
            let s = PlanShape {
                offload_optimizer: true,
                offload_gradients: true,
                reduce_bucket_bytes: 1024,
                device_arena,
                delayed_param_update,
                ..shape(ZeroStage::Zero2)
            };
            let p = plan_memory(&units(), &[&Schedule::sequential(2)], s).unwrap();
            p.offload.unwrap()
        };
        assert_eq!(at(false, false).landing, 0);
        let shared = at(true, false);
        assert_eq!(shared.landing, 256);
        assert!(!shared.grads_apart && shared.staging >= shared.landing);
        let want = shared.states + shared.grads + shared.staging + shared.delayed;
        assert_eq!(shared.optimizer_arena(), want);
        let apart = at(true, true);
        assert!(apart.grads_apart);
        assert_eq!(apart.grads_arena(), apart.grads + 256);
        assert_eq!(
            apart.optimizer_arena(),
            apart.states + apart.staging + apart.delayed
        );
        assert_eq!(apart.total(), apart.optimizer_arena() + apart.grads + 256);
    }
}
