//! Whole model states out of, and back into, a partitioned engine.
//!
//! Exported states are whole units (no padding) whatever the stage and world size, so a run
//! saved at one configuration resumes at any other; at the same configuration it resumes to
//! the bit, since every value is copied, never recomputed. For half precision the exported
//! parameters are the f32 master weights, from which the stored ones are rounded.

use super::engine::Engine;
use super::error::{Error, Result};
use super::unit_buffers::{write_whole, zeroed};
use zero_alloc::Handle;

/// One unit's whole model states.
#[derive(Debug, Clone, PartialEq)]
pub struct UnitState {
    /// Parameters (`numel` elements; the f32 master weights for half precision).
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
        self.complete_reductions(0)?;
        self.drop_prefetches()?;
        let mut out = Vec::with_capacity(self.specs.len());
        for unit in 0..self.specs.len() {
            let policy = self.policies[unit];
            let b = &self.bufs[unit];
            let (params, params_whole) = match b.master {
                Some(master) => (master, policy.whole_optim),
                None => (b.params, policy.whole_params),
            };
            let (m, v) = (b.m, b.v);
            out.push(UnitState {
                params: self.whole_f32(unit, params, params_whole)?,
                m: self.whole_f32(unit, m, policy.whole_optim)?,
                v: self.whole_f32(unit, v, policy.whole_optim)?,
            });
        }
        Ok(out)
    }

    /// The `numel` real elements of an f32 buffer kept whole or sharded (all-gathered).
    fn whole_f32(&self, unit: usize, h: Handle, whole: bool) -> Result<Vec<f32>> {
        let part = self.policies[unit].part;
        let local = self.arena.slice::<f32>(h)?;
        if whole {
            return Ok(local[..part.numel()].to_vec());
        }
        let mut full = vec![0f32; part.padded_numel()];
        self.comm.all_gather(local, &mut full)?;
        full.truncate(part.numel());
        Ok(full)
    }

    /// Loads whole states (as [`Engine::export_states`] gives) and the optimizer step count;
    /// each rank keeps what its stage stores. Not collective.
    ///
    /// # Errors
    /// [`Error::BadUnit`] when the number or sizes of units differ.
    pub fn import_states(&mut self, states: &[UnitState], steps: u64) -> Result<()> {
        if states.len() != self.specs.len() {
            return Err(Error::BadUnit {
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
            let policy = self.policies[unit];
            let numel = policy.part.numel();
            for (what, values) in [("params", &state.params), ("m", &state.m), ("v", &state.v)] {
                if values.len() != numel {
                    return Err(Error::BadUnit {
                        unit,
                        message: format!(
                            "saved {what} has {} elements, the unit {numel}",
                            values.len()
                        ),
                    });
                }
            }
            let staged = zeroed::<f32>(&mut self.arena, policy.part.padded_numel())?;
            self.arena.slice_mut::<f32>(staged)?[..numel].copy_from_slice(&state.params);
            let b = &self.bufs[unit];
            let written = write_whole(
                &mut self.arena,
                &policy,
                b,
                self.config.precision,
                rank,
                staged,
            );
            self.arena.free(staged)?;
            written?;
            let data = policy.part.data_shard(rank);
            for (h, values) in [(b.m, &state.m), (b.v, &state.v)] {
                let local = self.arena.slice_mut::<f32>(h)?;
                local.fill(0.0);
                if policy.whole_optim {
                    local[..numel].copy_from_slice(values);
                } else {
                    local[..data.len].copy_from_slice(&values[data.range()]);
                }
            }
        }
        self.steps = steps;
        Ok(())
    }
}
