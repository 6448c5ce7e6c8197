//! The paper's memory and communication math, as code.
//!
//! The engine reports these expected figures beside the bytes its arena measures, so a
//! discrepancy between design and implementation shows up in every run's metrics.
//! Notation follows the paper: Ψ parameters, N_d data-parallel ranks, K bytes of optimizer
//! state per parameter (K = 12 for mixed-precision Adam: fp32 master weights, m and v).

use super::partition::Partition;
use super::plan::model_state_bytes;
use super::policy::{UnitPolicy, ZeroStage};
use crate::error::Result;
use crate::precision::Precision;

/// Model-state bytes on one rank, by kind.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ModelStateBytes {
    /// Parameters as stored for compute (2 or 4 bytes per element).
    pub params: f64,
    /// Gradients as stored for compute.
    pub grads: f64,
    /// Optimizer states (master weights and moments).
    pub optimizer: f64,
}

impl ModelStateBytes {
    /// The sum of the three kinds.
    pub fn total(&self) -> f64 {
        self.params + self.grads + self.optimizer
    }
}

/// The paper's per-rank model-state bytes for `psi` parameters over `world` ranks.
///
/// Exact real-valued formulas (stage 1: 2Ψ + 2Ψ + KΨ/N_d, ...), without padding; the engine's
/// own figure, [`padded_model_state_bytes`], differs from this only by shard padding.
pub fn expected_model_state_bytes(
    psi: u64,
    world: usize,
    stage: ZeroStage,
    precision: Precision,
) -> ModelStateBytes {
    let psi = psi as f64;
    let n = world.max(1) as f64;
    let part = |partitioned: bool| if partitioned { 1.0 / n } else { 1.0 };
    ModelStateBytes {
        params: precision.param_bytes() as f64 * psi * part(stage.parameters_partitioned()),
        grads: precision.grad_bytes() as f64 * psi * part(stage.gradients_partitioned()),
        optimizer: precision.optimizer_bytes() as f64 * psi * part(stage.optimizer_partitioned()),
    }
}

/// The model-state bytes the engine actually stores on one rank for units of the given sizes:
/// replicated kinds hold whole units, partitioned kinds hold one shard of each. Both are
/// padded to `world * align` elements per unit: whole buffers too, so that the in-place
/// reduce-scatter and all-gather can run on them without a staging copy.
///
/// # Errors
/// A partition error when a unit cannot be partitioned (zero ranks, overflow).
pub fn padded_model_state_bytes(
    unit_numels: &[usize],
    world: usize,
    align: usize,
    stage: ZeroStage,
    precision: Precision,
) -> Result<ModelStateBytes> {
    let policies = unit_numels
        .iter()
        .map(|&numel| {
            let part = Partition::new(numel, world, align)?;
            Ok(UnitPolicy::with_partition(part, stage, precision, false))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(model_state_bytes(&policies, precision))
}

/// Elements each rank moves per optimizer step, in the paper's accounting (before the ring's
/// (N_d - 1)/N_d factor): 2Ψ for stages 0-2 (all-reduce, or reduce-scatter + all-gather), 3Ψ
/// for stage 3 (an all-gather before forward and before backward, a reduce-scatter after).
pub fn comm_elements_per_step(psi: u64, stage: ZeroStage) -> u64 {
    if stage.parameters_partitioned() {
        3 * psi
    } else {
        2 * psi
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GB: f64 = 1e9;

    /// The paper's Figure 1: Ψ = 7.5B, N_d = 64, K = 12.
    #[test]
    fn matches_the_papers_figure_one() {
        let psi = 7_500_000_000;
        let at = |stage| expected_model_state_bytes(psi, 64, stage, Precision::Bf16).total() / GB;
        assert_eq!(at(ZeroStage::Zero0), 120.0);
        assert!((at(ZeroStage::Zero1) - 31.4).abs() < 0.01);
        assert!((at(ZeroStage::Zero2) - 16.6).abs() < 0.05);
        assert!((at(ZeroStage::Zero3) - 1.875).abs() < 1e-9);
    }

    /// The paper's Table 1 row for 1T parameters at N_d = 1024: stage 3 needs 15.6 GB.
    #[test]
    fn a_trillion_parameters_fit_on_1024_ranks_at_stage_three() {
        let b =
            expected_model_state_bytes(1_000_000_000_000, 1024, ZeroStage::Zero3, Precision::Fp16);
        assert!((b.total() / GB - 15.6).abs() < 0.05);
    }

    #[test]
    fn fp32_adam_keeps_only_moments_beside_the_parameters() {
        let b = expected_model_state_bytes(1000, 1, ZeroStage::Zero0, Precision::Fp32);
        assert_eq!((b.params, b.grads, b.optimizer), (4000.0, 4000.0, 8000.0));
    }

    #[test]
    fn padding_only_adds_less_than_one_quantum_per_unit() {
        let units = [1001, 7, 4096];
        for stage in ZeroStage::ALL {
            let exact = expected_model_state_bytes(5104, 4, stage, Precision::Bf16);
            let padded = padded_model_state_bytes(&units, 4, 64, stage, Precision::Bf16).unwrap();
            let slack = (2 + 2 + 12) as f64 * (4.0 * 64.0) * units.len() as f64;
            assert!(padded.total() >= exact.total(), "{stage}");
            assert!(padded.total() - exact.total() <= slack, "{stage}");
        }
    }

    #[test]
    fn stage_three_moves_one_and_a_half_times_the_traffic() {
        assert_eq!(comm_elements_per_step(10, ZeroStage::Zero2), 20);
        assert_eq!(comm_elements_per_step(10, ZeroStage::Zero3), 30);
    }
}
