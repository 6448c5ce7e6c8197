//! Where every buffer of a rank goes, and how many bytes that takes, before anything is
//! allocated: so a configuration that cannot fit fails at start-up, naming a stage that would.

use super::formulas::ModelStateBytes;
use super::inflight::MAX_IN_FLIGHT;
use super::policy::{UnitPolicy, ZeroStage};
use super::precision::Precision;
use super::unit::UnitSpec;
use super::Result;

/// The bytes one rank needs for a configuration.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MemoryPlan {
    /// Persistent model states by kind.
    pub model_states: ModelStateBytes,
    /// Upper bound of the transient unit buffers (gathered parameters, unreduced gradients).
    pub transient: u64,
    /// The model's own bytes in the arena (activations), as declared.
    pub activations: u64,
}

impl MemoryPlan {
    /// Everything the rank's arena must hold.
    pub fn total(&self) -> u64 {
        self.model_states.total() as u64 + self.transient + self.activations
    }
}

/// What one rank's planning depends on besides the units.
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
}

/// Plans the buffers of `specs` on one rank.
///
/// Model states come from [`model_state_bytes`], the same sum the padded formula uses.
/// Transient buffers follow the units' declared lifetimes ([`UnitSpec::spans_micro_step`]):
/// at any moment the spanning units and one other unit hold a compute copy and an unreduced
/// gradient, which the engine enforces; prefetches, gradient buckets and room for the holes
/// that pinned blocks leave come on top.
///
/// # Errors
/// A partition error (zero ranks, overflow).
pub fn plan_memory(specs: &[UnitSpec], shape: PlanShape) -> Result<MemoryPlan> {
    let PlanShape {
        world,
        stage,
        precision,
        ..
    } = shape;
    let policies = specs
        .iter()
        .map(|s| UnitPolicy::new(s, world, stage, precision, shape.persistence_threshold))
        .collect::<Result<Vec<_>>>()?;
    let states = model_state_bytes(&policies, precision);
    let elem = precision.param_bytes();
    let f32_bytes = |p: &UnitPolicy| p.part.padded_numel() as u64 * 4;
    // Unreduced f32 gradients: every unit has one during its backward.
    let unreduced = live_at_once(specs, &policies, |_| true, f32_bytes);
    // f32 compute copies: units whose stored parameters the model cannot read directly.
    let copies = live_at_once(specs, &policies, |p| !p.reads_stored, f32_bytes);
    // Stage 3's all-gathers stage a whole unit in the storage type: the prefetched ones, and
    // in half precision the one being gathered now (f32 is gathered into its compute copy).
    let largest_gathered = policies
        .iter()
        .filter(|p| p.gathered())
        .map(|p| p.part.padded_numel() as u64 * elem)
        .max()
        .unwrap_or(0);
    let staged_now = u64::from(precision.has_master());
    let gathers = (staged_now + shape.prefetch_units as u64) * largest_gathered;
    let largest = policies.iter().map(|p| p.part.padded_numel() as u64).max();
    // Gradient buckets in flight (and the one being filled) hold their staged pieces; a
    // bucket is at most the bucket size, and never more than the largest unit (plus one
    // element per rank, the least a bucket holds, and the arena's rounding).
    let bucket = (shape.reduce_bucket_bytes as u64).min(largest.unwrap_or(0) * elem)
        + world as u64 * elem
        + 256;
    let buckets = (MAX_IN_FLIGHT as u64 + 1) * bucket;
    // Blocks lent to collectives in flight (gradient buckets, prefetched all-gathers) are
    // pinned: defragmentation cannot move them, so each can split the free space into one
    // more hole. Room for the largest transient block per pinned block keeps an allocation
    // from failing on holes too small while the total free space would suffice.
    let prefetching = if largest_gathered > 0 {
        shape.prefetch_units
    } else {
        0
    };
    let pinned = (MAX_IN_FLIGHT + prefetching) as u64;
    let fragmentation = pinned * largest.unwrap_or(0) * 4;
    Ok(MemoryPlan {
        model_states: states,
        transient: unreduced + copies + gathers + buckets + fragmentation,
        activations: shape.activation_bytes,
    })
}

/// Bytes of the units `alive` selects that can be live at once: every one that spans the
/// micro-step, plus the largest of the others (used one at a time).
fn live_at_once(
    specs: &[UnitSpec],
    policies: &[UnitPolicy],
    alive: impl Fn(&UnitPolicy) -> bool,
    bytes: impl Fn(&UnitPolicy) -> u64,
) -> u64 {
    let mut spanning = 0;
    let mut other = 0;
    for (spec, p) in specs.iter().zip(policies).filter(|(_, p)| alive(p)) {
        if spec.spans_micro_step {
            spanning += bytes(p);
        } else {
            other = other.max(bytes(p));
        }
    }
    spanning + other
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
/// [`Error::DoesNotFit`](super::Error::DoesNotFit).
pub fn check_fits(specs: &[UnitSpec], shape: PlanShape, limit: u64) -> Result<MemoryPlan> {
    let stage = shape.stage;
    let plan = |stage| plan_memory(specs, PlanShape { stage, ..shape });
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
    Err(super::Error::DoesNotFit {
        stage,
        needed: wanted.total(),
        limit,
        hint,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Units of 1000 (spanning the micro-step) and 512 elements.
    fn units() -> Vec<UnitSpec> {
        vec![
            UnitSpec::new("a", 1000).spanning_micro_step(),
            UnitSpec::new("b", 64 * 8),
        ]
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
        }
    }

    #[test]
    fn each_stage_needs_less_than_the_one_before() {
        let need: Vec<u64> = ZeroStage::ALL
            .iter()
            .map(|&s| {
                plan_memory(&units(), shape(s))
                    .unwrap()
                    .model_states
                    .total() as u64
            })
            .collect();
        assert!(need.windows(2).all(|w| w[1] < w[0]), "{need:?}");
    }

    #[test]
    fn a_spanning_unit_adds_to_the_others_which_count_once() {
        let transient = |units: &[UnitSpec]| {
            plan_memory(units, shape(ZeroStage::Zero1))
                .unwrap()
                .transient
        };
        let one_at_a_time = [UnitSpec::new("a", 1000), UnitSpec::new("b", 512)];
        // Unreduced f32 gradients: 1024 x 4 alone, or 1024 x 4 + 512 x 4 side by side.
        assert_eq!(transient(&units()) - transient(&one_at_a_time), 512 * 4);
    }

    #[test]
    fn a_tight_cap_names_the_lowest_stage_that_fits() {
        // Units of 1000 and 512 elements over 4 ranks pad to 1024 and 512 (shards 256, 128).
        // Stage 1: params 6144 + grads 6144 + m,v 3072 bytes; transients: unreduced f32
        // gradients of the spanning unit and the other (4096 + 2048), no compute copies
        // (whole f32 parameters), 3 gradient buckets of a whole unit each, one element per
        // rank and the arena's rounding (3 x 4368), and a hole of the largest unit (4096)
        // beside each of the 2 buckets in flight = 42800.
        let stage1 = plan_memory(&units(), shape(ZeroStage::Zero1))
            .unwrap()
            .total();
        assert_eq!(stage1, 42800);
        let err = check_fits(&units(), shape(ZeroStage::Zero0), stage1).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("stage 1 fits"), "{msg}");
        assert!(msg.contains("52016"), "stage 0 needs 24576 + 27440: {msg}");
        assert!(check_fits(&units(), shape(ZeroStage::Zero1), stage1).is_ok());
    }
}
