//! Model states out of, and back into, a partitioned engine: whole units
//! ([`Engine::export_states`] / [`Engine::import_states`]), or each rank's own shard of
//! every unit with no collective ([`Engine::owned_states`] / [`Engine::import_owned`]).
//!
//! Whole exported states are whole units (no padding) whatever the stage and world size, so a run
//! saved at one configuration resumes at any other; at the same configuration it resumes to
//! the bit, since every value is copied, never recomputed. For half precision the exported
//! parameters are the f32 master weights, from which the stored ones are rounded.

use super::engine::Engine;
use super::error::{Error, Result};
use super::host_io::read_f32;
use super::kernels::Span;
use super::optimizer_file::OptimState;
use super::optimizer_home::StateHome;
use super::planning::partition::{Partition, Shard};
use super::planning::policy::UnitPolicy;
use super::start::store_params;
use super::transient::free_after;
use super::unit_buffers::kept_values;
use std::ops::Range;
use zero_alloc::Handle;
use zero_comm::{Communicator, DType};

/// One of a unit's three f32 model states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StateKind {
    /// Parameters (the f32 master weights for half precision).
    Params,
    /// Adam's first moment.
    AdamM,
    /// Adam's second moment.
    AdamV,
}

impl StateKind {
    /// The three kinds, in the order checkpoints store them.
    pub const ALL: [StateKind; 3] = [Self::Params, Self::AdamM, Self::AdamV];

    /// The name checkpoints give it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Params => "params",
            Self::AdamM => "adam_m",
            Self::AdamV => "adam_v",
        }
    }
}

/// The states of the elements of one unit a rank owns, copied from its arena: the real
/// elements of its shard (`range`, possibly empty for the last ranks), at every stage.
#[derive(Debug, Clone)]
pub struct OwnedStates {
    /// The owned elements, in the coordinates of the whole unit.
    pub range: Range<usize>,
    /// Parameters (the f32 master weights for half precision), `range.len()` elements.
    pub params: Vec<f32>,
    /// Adam's first moment.
    pub m: Vec<f32>,
    /// Adam's second moment.
    pub v: Vec<f32>,
}

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
        self.land_delayed()?;
        self.complete_reductions(0)?;
        self.drop_prefetches()?;
        let mut out = Vec::with_capacity(self.units.specs.len());
        for unit in 0..self.units.specs.len() {
            out.push(UnitState {
                params: self.with_held_params(unit, |x| x)?,
                m: self.whole_optim(unit, OptimState::M)?,
                v: self.whole_optim(unit, OptimState::V)?,
            });
        }
        Ok(out)
    }

    /// Runs `f` on `unit`'s whole f32 parameters (the master weights for half precision):
    /// read in place where this rank keeps them whole, else all-gathered into one transient
    /// block of the arena that holds them (a heap buffer for offloaded master weights), freed
    /// after `f`. So an export streamed unit by unit holds at most one unit beyond the rank's
    /// own states. Collective where parameters are sharded: every rank calls it for the same
    /// units in the same order.
    ///
    /// # Errors
    /// [`Error::NoSuchUnit`], collective or arena failures.
    pub fn with_whole_params<R>(&mut self, unit: usize, f: impl FnOnce(&[f32]) -> R) -> Result<R> {
        self.land_delayed()?;
        self.check_unit(unit)?;
        self.complete_reductions(0)?;
        self.drop_prefetches()?;
        self.with_held_params(unit, |x| f(&x))
    }

    /// Runs `f` on `unit`'s whole f32 parameters: the master weights for half precision
    /// ([`Engine::whole_optim`]), else the stored ones, all-gathered in the engine's arena
    /// where sharded.
    fn with_held_params<R>(&mut self, unit: usize, f: impl FnOnce(Vec<f32>) -> R) -> Result<R> {
        let policy = self.units.policies[unit];
        if self.units.bufs[unit].master.is_some() {
            return Ok(f(self.whole_optim(unit, OptimState::Master)?));
        }
        if self.params_offloaded(unit) {
            let local = self.read_stored(unit, 0..policy.len(false))?;
            return Ok(f(gather_on_host(&self.comm, &policy, false, local)?));
        }
        let params = self.units.bufs[unit].params;
        with_whole_f32(self.device_home(), &policy, params, policy.whole_params, f)
    }

    /// `unit`'s whole f32 optimizer `state` (its `numel` real elements), wherever the states
    /// live: all-gathered in the engine's arena, or through host buffers when offloaded (to
    /// the host arena or the file).
    fn whole_optim(&mut self, unit: usize, state: OptimState) -> Result<Vec<f32>> {
        let policy = self.units.policies[unit];
        let whole = policy.whole_optim;
        if self.offloaded.is_none() {
            let h = self.optim_handle(unit, state)?;
            return with_whole_f32(self.optimizer_home(), &policy, h, whole, |x| x);
        }
        let local = self.read_optim(unit, state, 0..policy.len(whole))?;
        gather_on_host(&self.comm, &policy, whole, local)
    }

    /// The split of `unit` across the ranks.
    ///
    /// # Errors
    /// [`Error::NoSuchUnit`].
    pub fn partition(&self, unit: usize) -> Result<Partition> {
        self.check_unit(unit)?;
        Ok(self.units.policies[unit].part)
    }

    /// This rank's owned elements of `unit` and their states, copied to the host with no
    /// collective: every rank owns the real elements of its shard at every stage (at stages 0-2,
    /// where parameters or moments are whole on every rank, the slice is cut from them), so
    /// the ranks' pieces together hold each element once. Finishes pending gradient
    /// reductions and drops prefetched gathers first.
    ///
    /// # Errors
    /// [`Error::NoSuchUnit`], collective or arena failures.
    pub fn owned_states(&mut self, unit: usize) -> Result<OwnedStates> {
        self.land_delayed()?;
        self.check_unit(unit)?;
        self.complete_reductions(0)?;
        self.drop_prefetches()?;
        let rank = self.rank();
        let policy = self.units.policies[unit];
        let owned = policy.part.data_shard(rank);
        let b = &self.units.bufs[unit];
        let kept = policy.part.local(rank, owned, policy.whole_optim);
        let params = match b.master {
            Some(_) => self.read_optim(unit, OptimState::Master, kept.clone())?,
            None => {
                let stored = policy.part.local(rank, owned, policy.whole_params);
                self.read_stored(unit, stored)?
            }
        };
        Ok(OwnedStates {
            range: owned.range(),
            params,
            m: self.read_optim(unit, OptimState::M, kept.clone())?,
            v: self.read_optim(unit, OptimState::V, kept)?,
        })
    }

    /// The elements of `unit` whose `kind` this rank keeps: the whole unit where that
    /// state is whole here, else its shard's real elements. A restore reads exactly these.
    ///
    /// # Errors
    /// [`Error::NoSuchUnit`].
    pub fn held_range(&self, unit: usize, kind: StateKind) -> Result<Range<usize>> {
        self.check_unit(unit)?;
        let policy = self.units.policies[unit];
        let whole = match kind {
            StateKind::Params => policy.whole_params || policy.whole_optim,
            StateKind::AdamM | StateKind::AdamV => policy.whole_optim,
        };
        Ok(if whole {
            0..policy.part.numel()
        } else {
            policy.part.data_shard(self.rank()).range()
        })
    }

    /// Stores `values`, the `kind` states of elements `range` of `unit`, into whatever this
    /// rank keeps of them (parameters into the stored copy, rounded for half precision, and
    /// into the master copy); elements it does not keep are skipped. Not collective.
    ///
    /// # Errors
    /// [`Error::BadUnit`] when `range` is not inside the unit or `values` has another
    /// length; [`Error::NoSuchUnit`]; arena failures.
    pub fn import_owned(
        &mut self,
        unit: usize,
        kind: StateKind,
        range: Range<usize>,
        values: &[f32],
    ) -> Result<()> {
        self.check_unit(unit)?;
        self.land_delayed()?;
        let policy = self.units.policies[unit];
        let numel = policy.part.numel();
        if range.start > range.end || range.end > numel || values.len() != range.len() {
            return Err(Error::BadUnit {
                unit,
                message: format!(
                    "{} elements {}..{} with {} values do not fit a unit of {numel}",
                    kind.name(),
                    range.start,
                    range.end,
                    values.len()
                ),
            });
        }
        let rank = self.rank();
        let given = Shard {
            offset: range.start,
            len: range.len(),
        };
        // The part of `given` a buffer kept whole or as this rank's shard holds, as
        // (indices into `values`, indices into the buffer).
        let window = |whole: bool| {
            let kept = if whole {
                Shard {
                    offset: 0,
                    len: numel,
                }
            } else {
                policy.part.data_shard(rank)
            };
            let common = given.intersect(kept);
            let from = common.offset - given.offset..common.end() - given.offset;
            (from, policy.part.local(rank, common, whole))
        };
        let b = &self.units.bufs[unit];
        let f32_target = match kind {
            StateKind::Params => b.master.map(|_| OptimState::Master),
            StateKind::AdamM => Some(OptimState::M),
            StateKind::AdamV => Some(OptimState::V),
        };
        if let Some(state) = f32_target {
            let (from, to) = window(policy.whole_optim);
            self.write_optim(unit, state, to.start, &values[from])?;
        }
        if kind == StateKind::Params {
            let (from, to) = window(policy.whole_params);
            self.write_stored_params(unit, to.start, &values[from])?;
        }
        Ok(())
    }

    /// Sets the optimizer step count (Adam's t) of a restored run.
    pub fn set_steps(&mut self, steps: u64) {
        self.progress.steps = steps;
    }

    /// Restores fp16's loss scaler in a resumed run: its scale and its
    /// [`progress`](crate::LossScaler::progress) (clean steps, overflows still tolerated).
    /// Other precisions keep their inert scale of 1.
    pub fn set_loss_scaler(&mut self, scale: f32, clean_steps: u32, hysteresis_left: u32) {
        if self.config.precision == super::precision::Precision::Fp16 {
            self.progress.scaler.scale = scale;
            self.progress
                .scaler
                .set_progress(clean_steps, hysteresis_left);
        }
    }

    /// fp16's loss scaler as it stands (what a checkpoint keeps).
    pub fn loss_scaler(&self) -> crate::LossScaler {
        self.progress.scaler
    }

    /// Loads whole states (as [`Engine::export_states`] gives) and the optimizer step count;
    /// each rank keeps what its stage stores. Not collective.
    ///
    /// # Errors
    /// [`Error::BadUnit`] when the number or sizes of units differ.
    pub fn import_states(&mut self, states: &[UnitState], steps: u64) -> Result<()> {
        self.land_delayed()?;
        if states.len() != self.units.specs.len() {
            return Err(Error::BadUnit {
                unit: states.len().min(self.units.specs.len()),
                message: format!(
                    "the saved state has {} units, the model {}",
                    states.len(),
                    self.units.specs.len()
                ),
            });
        }
        let rank = self.rank();
        for (unit, state) in states.iter().enumerate() {
            let policy = self.units.policies[unit];
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
            let b = &self.units.bufs[unit];
            store_params(
                (&mut self.arena, self.kernels.as_ref()),
                self.offloaded_params.as_mut(),
                (unit, &policy, b),
                (self.config.precision, rank),
                &state.params,
            )?;
            let has_master = b.master.is_some();
            let whole = policy.whole_optim;
            if has_master {
                let kept = kept_values(&policy, rank, whole, &state.params);
                self.write_optim(unit, OptimState::Master, 0, &kept)?;
            }
            let m = kept_values(&policy, rank, whole, &state.m);
            self.write_optim(unit, OptimState::M, 0, &m)?;
            let v = kept_values(&policy, rank, whole, &state.v);
            self.write_optim(unit, OptimState::V, 0, &v)?;
        }
        self.progress.steps = steps;
        Ok(())
    }
}

/// The `numel` real elements of an f32 buffer of `home`'s arena kept whole or sharded, handed
/// to `f`: all-gathered into a transient block of that arena, freed before returning, or into
/// a heap buffer for the offloaded host arena.
fn with_whole_f32<R>(
    home: StateHome<'_>,
    policy: &UnitPolicy,
    h: Handle,
    whole: bool,
    f: impl FnOnce(Vec<f32>) -> R,
) -> Result<R> {
    let numel = policy.part.numel();
    if whole {
        return Ok(f(read_f32(home.arena, h, 0..numel)?));
    }
    let padded = policy.part.padded_numel();
    let Some(collectives) = home.collectives else {
        let shard = read_f32(home.arena, h, 0..policy.len(false))?;
        return Ok(f(gather_on_host(home.comm, policy, false, shard)?));
    };
    let full = home.arena.alloc_elems::<f32>(padded)?;
    let shard = Span::new(h, 0..policy.len(false));
    let gathered = collectives.all_gather(
        home.comm,
        home.arena,
        DType::F32,
        shard,
        Span::new(full, 0..padded),
    );
    let result = gathered.and_then(|()| read_f32(home.arena, full, 0..numel));
    Ok(f(free_after(home.arena, full, result)?))
}

/// The `numel` real elements of a unit from `local`, this rank's values of a buffer kept
/// whole or sharded: all-gathered through `comm`'s host path where sharded.
fn gather_on_host(
    comm: &Communicator,
    policy: &UnitPolicy,
    whole: bool,
    mut local: Vec<f32>,
) -> Result<Vec<f32>> {
    let numel = policy.part.numel();
    if whole {
        local.truncate(numel);
        return Ok(local);
    }
    let mut full = vec![0f32; policy.part.padded_numel()];
    comm.all_gather(&local, &mut full)?;
    full.truncate(numel);
    Ok(full)
}
