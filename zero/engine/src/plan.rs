//! Where every buffer of a rank goes, and how many bytes that takes, before anything is
//! allocated: so a configuration that cannot fit fails at start-up, naming a stage that would.

use super::formulas::ModelStateBytes;
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
}

impl MemoryPlan {
    /// Everything the rank's arena must hold.
    pub fn total(&self) -> u64 {
        self.model_states.total() as u64 + self.transient
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
}

/// Plans the buffers of `specs` on one rank.
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
    let mut states = ModelStateBytes::default();
    let mut largest = 0u64;
    for spec in specs {
        let p = UnitPolicy::new(spec, world, stage, precision, shape.persistence_threshold)?;
        let count = |whole| p.len(whole) as f64;
        states.params += count(p.whole_params) * precision.param_bytes() as f64;
        states.grads += count(p.whole_grads) * precision.grad_bytes() as f64;
        // K bytes: m and v, plus the f32 master weights for half precision.
        states.optimizer += count(p.whole_optim) * precision.optimizer_bytes() as f64;
        largest = largest.max(p.part.padded_numel() as u64);
    }
    // Backward holds at most three unreduced f32 gradient units at once (the tied
    // embedding, the final norm, the current block). f32 compute copies of parameters exist
    // at stage 3 (gathered) and at half precision (widened): as many again, plus the
    // prefetched ones.
    let copies = if stage == ZeroStage::Zero3 || precision.has_master() {
        3 + shape.prefetch_units as u64
    } else {
        0
    };
    // Gradient buckets in flight (and the one being filled) hold their staged pieces; a
    // bucket is at most the bucket size, and never more than the largest unit.
    let elem = if precision.has_master() { 2 } else { 4 };
    // (Plus one element per rank, the least a bucket holds, and the arena's rounding.)
    let bucket = (shape.reduce_bucket_bytes as u64).min(largest * elem) + world as u64 * elem + 256;
    let buckets = (super::inflight::MAX_IN_FLIGHT as u64 + 1) * bucket;
    // Prefetched all-gathers stage whole units in the storage type.
    let prefetched = shape.prefetch_units as u64 * largest * elem;
    Ok(MemoryPlan {
        model_states: states,
        transient: (3 + copies) * largest * 4 + buckets + prefetched,
    })
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
    fn a_tight_cap_names_the_lowest_stage_that_fits() {
        // Units of 1000 and 512 elements over 4 ranks pad to 1024 and 512 (shards 256, 128).
        // Stage 1: params 6144 + grads 6144 + m,v 3072 bytes, plus transients of the largest
        // unit (4096 bytes): 3 unreduced (12288), 3 gradient buckets of a whole unit each,
        // one element per rank and the arena's rounding (3 x 4368), 1 prefetch (4096) = 44848.
        let stage1 = plan_memory(&units(), shape(ZeroStage::Zero1))
            .unwrap()
            .total();
        assert_eq!(stage1, 44848);
        let err = check_fits(&units(), shape(ZeroStage::Zero0), stage1).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("stage 1 fits"), "{msg}");
        assert!(msg.contains("54064"), "stage 0 needs 24576 + 29488: {msg}");
        assert!(check_fits(&units(), shape(ZeroStage::Zero1), stage1).is_ok());
    }
}
