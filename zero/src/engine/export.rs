//! Whole model states out of, and back into, a partitioned engine.
//!
//! Exported states are whole units (no padding) whatever the stage and world size, so a run
//! saved at one configuration resumes at any other; at the same configuration it resumes to
//! the bit, since every value is copied, never recomputed.

use super::error::{EngineError, Result};
use super::state::Engine;

/// One unit's whole model states.
#[derive(Debug, Clone, PartialEq)]
pub struct UnitState {
    /// Parameters (`numel` elements).
    pub params: Vec<f32>,
    /// Adam's first moment.
    pub m: Vec<f32>,
    /// Adam's second moment.
    pub v: Vec<f32>,
}

impl Engine {
    /// Every unit's whole parameters and moments. Collective: every rank must call it; every
    /// rank gets the same result.
    ///
    /// # Errors
    /// Collective or arena failures.
    pub fn export_states(&mut self) -> Result<Vec<UnitState>> {
        let mut out = Vec::with_capacity(self.specs.len());
        for unit in 0..self.specs.len() {
            let plan = self.plans[unit];
            let numel = plan.part.numel();
            let whole = |engine: &Self, h, is_whole: bool| -> Result<Vec<f32>> {
                let local = engine.arena.slice::<f32>(h)?;
                if is_whole {
                    return Ok(local[..numel].to_vec());
                }
                let mut full = vec![0f32; plan.part.padded_numel()];
                engine.comm.all_gather(local, &mut full)?;
                full.truncate(numel);
                Ok(full)
            };
            let b = &self.bufs[unit];
            out.push(UnitState {
                params: whole(self, b.params, plan.whole_params)?,
                m: whole(self, b.m, plan.whole_optim)?,
                v: whole(self, b.v, plan.whole_optim)?,
            });
        }
        Ok(out)
    }

    /// Loads whole states (as [`Engine::export_states`] gives) and the optimizer step count;
    /// each rank keeps what its stage stores. Not collective.
    ///
    /// # Errors
    /// [`EngineError::BadUnit`] when the number or sizes of units differ.
    pub fn import_states(&mut self, states: &[UnitState], steps: u64) -> Result<()> {
        if states.len() != self.specs.len() {
            return Err(EngineError::BadUnit {
                unit: states.len().min(self.specs.len()),
                message: format!(
                    "the saved state has {} units, the model {}",
                    states.len(),
                    self.specs.len()
                ),
            });
        }
        let rank = self.rank();
        for (unit, state) in states.iter().enumerate() {
            let plan = self.plans[unit];
            let numel = plan.part.numel();
            for (what, values) in [("params", &state.params), ("m", &state.m), ("v", &state.v)] {
                if values.len() != numel {
                    return Err(EngineError::BadUnit {
                        unit,
                        message: format!(
                            "saved {what} has {} elements, the unit {numel}",
                            values.len()
                        ),
                    });
                }
            }
            let b = &self.bufs[unit];
            let targets = [
                (b.params, plan.whole_params, &state.params),
                (b.m, plan.whole_optim, &state.m),
                (b.v, plan.whole_optim, &state.v),
            ];
            for (h, is_whole, values) in targets {
                let local = self.arena.slice_mut::<f32>(h)?;
                local.fill(0.0);
                if is_whole {
                    local[..numel].copy_from_slice(values);
                } else {
                    let data = plan.part.data_shard(rank);
                    local[..data.len].copy_from_slice(&values[data.range()]);
                }
            }
        }
        self.steps = steps;
        Ok(())
    }
}
