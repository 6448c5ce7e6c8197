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
use super::host_io::{read_f32, write_f32, write_stored};
use super::kernels::Span;
use super::optimizer_home::StateHome;
use super::planning::partition::{Partition, Shard};
use super::planning::policy::UnitPolicy;
use super::transient::free_after;
use super::unit_buffers::{upload_whole, write_kept, write_params};
use std::ops::Range;
use zero_alloc::Handle;
use zero_comm::DType;

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
        self.complete_reductions(0)?;
        self.drop_prefetches()?;
        let mut out = Vec::with_capacity(self.units.specs.len());
        for unit in 0..self.units.specs.len() {
            let policy = self.units.policies[unit];
            let (m, v) = (self.units.bufs[unit].m, self.units.bufs[unit].v);
            let params = self.with_held_params(unit, |home, h, whole| {
                with_whole_f32(home, &policy, h, whole, |x| x)
            })?;
            let mut moment =
                |h| with_whole_f32(self.optimizer_home(), &policy, h, policy.whole_optim, |x| x);
            out.push(UnitState {
                params,
                m: moment(m)?,
                v: moment(v)?,
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
        self.check_unit(unit)?;
        self.complete_reductions(0)?;
        self.drop_prefetches()?;
        let policy = self.units.policies[unit];
        self.with_held_params(unit, |home, h, whole| {
            with_whole_f32(home, &policy, h, whole, |x| f(&x))
        })
    }

    /// Runs `f` on the arena holding `unit`'s f32 parameters (the master weights in the
    /// optimizer's home for half precision, else the stored ones), their block, and whether
    /// it is whole.
    fn with_held_params<R>(
        &mut self,
        unit: usize,
        f: impl FnOnce(StateHome<'_>, Handle, bool) -> R,
    ) -> R {
        let policy = self.units.policies[unit];
        match self.units.bufs[unit].master {
            Some(master) => f(self.optimizer_home(), master, policy.whole_optim),
            None => {
                let params = self.units.bufs[unit].params;
                f(self.device_home(), params, policy.whole_params)
            }
        }
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
        self.check_unit(unit)?;
        self.complete_reductions(0)?;
        self.drop_prefetches()?;
        let rank = self.rank();
        let policy = self.units.policies[unit];
        let owned = policy.part.data_shard(rank);
        let b = &self.units.bufs[unit];
        let optim = self.optimizer_arena();
        let cut = |arena, h: Handle, whole: bool| -> Result<Vec<f32>> {
            read_f32(arena, h, policy.part.local(rank, owned, whole))
        };
        let params = match b.master {
            Some(master) => cut(optim, master, policy.whole_optim)?,
            None => cut(&self.arena, b.params, policy.whole_params)?,
        };
        Ok(OwnedStates {
            range: owned.range(),
            params,
            m: cut(optim, b.m, policy.whole_optim)?,
            v: cut(optim, b.v, policy.whole_optim)?,
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
        let (stored, precision) = (b.params, self.config.precision);
        let f32_targets = match kind {
            StateKind::Params => b.master.map(|h| (h, policy.whole_optim)),
            StateKind::AdamM => Some((b.m, policy.whole_optim)),
            StateKind::AdamV => Some((b.v, policy.whole_optim)),
        };
        if let Some((h, whole)) = f32_targets {
            let (from, to) = window(whole);
            write_f32(self.optimizer_home().arena, h, to.start, &values[from])?;
        }
        if kind == StateKind::Params {
            let (from, to) = window(policy.whole_params);
            write_stored(&mut self.arena, precision, stored, to.start, &values[from])?;
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
            let kernels = self.kernels.as_ref();
            let staged = upload_whole(&mut self.arena, kernels, &policy, &state.params)?;
            let b = &self.units.bufs[unit];
            let precision = self.config.precision;
            let written = write_params(
                &mut self.arena,
                kernels,
                &policy,
                b,
                precision,
                rank,
                staged,
            );
            free_after(&mut self.arena, staged, written)?;
            let (master, m, v) = (b.master, b.m, b.v);
            let home = self.optimizer_home().arena;
            if let Some(master) = master {
                write_kept(
                    home,
                    &policy,
                    rank,
                    policy.whole_optim,
                    master,
                    &state.params,
                )?;
            }
            write_kept(home, &policy, rank, policy.whole_optim, m, &state.m)?;
            write_kept(home, &policy, rank, policy.whole_optim, v, &state.v)?;
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
        let mut full = vec![0f32; padded];
        home.comm.all_gather(&shard, &mut full)?;
        full.truncate(numel);
        return Ok(f(full));
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
