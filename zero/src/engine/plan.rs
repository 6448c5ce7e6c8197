//! Where every buffer of a rank goes, and how many bytes that takes, before anything is
//! allocated: so a configuration that cannot fit fails at start-up, naming a stage that would.

use super::memory::{ModelStateBytes, ZeroStage};
use super::partition::Partition;
use super::unit::UnitSpec;
use super::Result;

/// Bytes per stored element. The engine stores fp32 today; mixed precision will make this a
/// per-kind figure.
pub(crate) const ELEM: u64 = 4;

/// Shards are multiples of 64 elements: 256 bytes, the arena's alignment, so every shard
/// starts on an aligned boundary and no block wastes rounding.
pub const SHARD_ALIGN_ELEMS: usize = 64;

/// How one unit is laid out on this rank.
#[derive(Debug, Clone, Copy)]
pub(crate) struct UnitPlan {
    pub part: Partition,
    /// Parameters kept whole on every rank: stages 0-2, and units under the persistence
    /// threshold at stage 3.
    pub whole_params: bool,
    /// Gradients accumulated whole (stages 0-1) rather than as one shard.
    pub whole_grads: bool,
    /// Optimizer states whole (stage 0) rather than as one shard.
    pub whole_optim: bool,
}

impl UnitPlan {
    pub fn new(
        spec: &UnitSpec,
        world: usize,
        stage: ZeroStage,
        persistence_threshold: usize,
    ) -> Result<Self> {
        let part = Partition::new(spec.numel, world, SHARD_ALIGN_ELEMS)?;
        Ok(Self {
            part,
            whole_params: stage < ZeroStage::Zero3 || spec.numel < persistence_threshold,
            whole_grads: stage < ZeroStage::Zero2,
            whole_optim: stage == ZeroStage::Zero0,
        })
    }

    /// Elements of a buffer kept whole (`true`) or as this rank's shard.
    pub fn len(&self, whole: bool) -> usize {
        if whole {
            self.part.padded_numel()
        } else {
            self.part.shard_len()
        }
    }
}

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

/// Plans the buffers of `specs` on one rank.
///
/// # Errors
/// A partition error (zero ranks, overflow).
pub fn plan_memory(
    specs: &[UnitSpec],
    world: usize,
    stage: ZeroStage,
    persistence_threshold: usize,
    prefetch_units: usize,
) -> Result<MemoryPlan> {
    let mut states = ModelStateBytes::default();
    let mut largest = 0u64;
    for spec in specs {
        let p = UnitPlan::new(spec, world, stage, persistence_threshold)?;
        states.params += (p.len(p.whole_params) as u64 * ELEM) as f64;
        states.grads += (p.len(p.whole_grads) as u64 * ELEM) as f64;
        // fp32 Adam: m and v (the parameters are the master copy).
        states.optimizer += (2 * p.len(p.whole_optim) as u64 * ELEM) as f64;
        largest = largest.max(p.part.padded_numel() as u64 * ELEM);
    }
    // Backward holds at most three unreduced gradient units at once (the tied embedding, the
    // final norm, the current block); stage 3 also holds that many gathered units plus the
    // prefetched ones.
    let gathered = if stage == ZeroStage::Zero3 {
        3 + prefetch_units as u64
    } else {
        0
    };
    Ok(MemoryPlan {
        model_states: states,
        transient: (3 + gathered) * largest,
    })
}

/// Checks `stage` against a memory cap; on failure names the lowest stage that fits.
///
/// # Errors
/// [`EngineError::DoesNotFit`](super::EngineError::DoesNotFit).
pub fn check_fits(
    specs: &[UnitSpec],
    world: usize,
    stage: ZeroStage,
    persistence_threshold: usize,
    prefetch_units: usize,
    limit: u64,
) -> Result<MemoryPlan> {
    let plan = |s| plan_memory(specs, world, s, persistence_threshold, prefetch_units);
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
    Err(super::EngineError::DoesNotFit {
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

    #[test]
    fn each_stage_needs_less_than_the_one_before() {
        let need: Vec<u64> = ZeroStage::ALL
            .iter()
            .map(|&s| {
                plan_memory(&units(), 4, s, 0, 1)
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
        // Stage 1: params 6144 + grads 6144 + m,v 3072 bytes, plus 3 x 4096 transient = 27648.
        let stage1 = plan_memory(&units(), 4, ZeroStage::Zero1, 0, 1)
            .unwrap()
            .total();
        assert_eq!(stage1, 27648);
        let err = check_fits(&units(), 4, ZeroStage::Zero0, 0, 1, stage1).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("stage 1 fits"), "{msg}");
        assert!(msg.contains("36864"), "stage 0 needs 24576 + 12288: {msg}");
        assert!(check_fits(&units(), 4, ZeroStage::Zero1, 0, 1, stage1).is_ok());
    }
}
