//! Forward: a unit's whole f32 parameters made available while the model reads them
//! (all-gathered at stage 3, widened from half precision), prefetched ahead in the recorded
//! unit order, and freed on release.

use super::collectives::InPlace;
use super::engine::Engine;
use super::error::{Error, Result};
use super::inflight::Prefetch;
use super::kernels::Span;
use super::precision::{with_store, Store};
use super::trace::Launched;
use super::transient::{free_after, free_on_error};
use zero_alloc::Handle;

impl Engine {
    /// Makes `unit`'s whole parameters available in f32: stage 3 all-gathers the shards,
    /// half precision widens; whole f32 parameters need nothing. Balanced by
    /// [`Engine::release`]; nested calls share one copy.
    ///
    /// # Errors
    /// Unknown unit, a rank visiting units in another order, arena or collective failures.
    pub(crate) fn gather(&mut self, unit: usize) -> Result<()> {
        self.check_unit(unit)?;
        if self.units.policies[unit].reads_stored {
            return Ok(());
        }
        let b = &mut self.units.bufs[unit];
        b.gather_refs += 1;
        if b.gathered.is_some() {
            return Ok(());
        }
        let copy = match self.flights.prefetched[unit].take() {
            Some(prefetch) => prefetch.finish(self)?,
            // An offloaded shard is not in the arena to all-gather from: it is fetched into
            // the gather's buffer, as a prefetch does.
            None if self.params_offloaded(unit) => {
                let launched =
                    with_store!(self.config.precision, S => self.launch_gather::<S>(unit))?;
                launched.finish(self)?
            }
            None => with_store!(self.config.precision, S => self.compute_copy::<S>(unit))?,
        };
        self.units.bufs[unit].gathered = Some(copy);
        with_store!(self.config.precision, S => self.launch_prefetches::<S>())
    }

    /// A new f32 block holding `unit`'s whole (padded) parameters. f32 storage is
    /// all-gathered straight into it; half precision is gathered into a staging block of
    /// the storage type and widened.
    fn compute_copy<S: Store>(&mut self, unit: usize) -> Result<Handle> {
        let policy = self.units.policies[unit];
        let padded = policy.part.padded_numel();
        let params = self.units.bufs[unit].params;
        let out = self.alloc_transient::<f32>(padded)?;
        let direct = policy.gathered() && std::mem::size_of::<S>() == 4;
        let staged = if !policy.gathered() || direct {
            None
        } else {
            Some(self.alloc_transient::<S>(padded)?)
        };
        let result = (|| -> Result<()> {
            let gather_into = if direct { Some(out) } else { staged };
            if let Some(h) = gather_into {
                let shard = Span::new(params, 0..policy.len(policy.whole_params));
                let whole = Span::new(h, 0..padded);
                self.collectives
                    .all_gather(&self.comm, &mut self.arena, S::DTYPE, shard, whole)?;
                self.progress.traffic.all_gather += padded as u64;
            }
            if direct {
                // f32 storage: the compute copy is the gathered buffer itself.
                return Ok(());
            }
            let whole = Span::new(staged.unwrap_or(params), 0..padded);
            self.kernels.widen(
                &mut self.arena,
                S::DTYPE,
                whole,
                Span::new(out, 0..padded),
                1.0,
            )
        })();
        let result = match staged {
            Some(h) => free_after(&mut self.arena, h, result),
            None => result,
        };
        free_on_error(&mut self.arena, out, result.map(|()| out))
    }

    /// Stage 3: launches the all-gathers of the next `prefetch_units` units of the declared
    /// schedule, so they arrive while the current unit computes. Every rank declared the same
    /// schedule and has made the same calls so far, so every rank launches the same
    /// collectives in the same sequence.
    fn launch_prefetches<S: Store>(&mut self) -> Result<()> {
        for unit in self.declared.upcoming_gathers(self.config.prefetch_units) {
            let policy = self.units.policies[unit];
            let b = &self.units.bufs[unit];
            if !policy.gathered() || b.gathered.is_some() || self.flights.prefetched[unit].is_some()
            {
                continue;
            }
            self.flights.prefetched[unit] = Some(self.launch_gather::<S>(unit)?);
        }
        Ok(())
    }

    /// Launches `unit`'s in-place all-gather: this rank's shard is copied into its chunk of
    /// a whole-unit block (from the arena, or fetched from the offloaded parameters' home),
    /// which the collective holds until it lands.
    fn launch_gather<S: Store>(&mut self, unit: usize) -> Result<Prefetch> {
        let policy = self.units.policies[unit];
        let params = self.units.bufs[unit].params;
        let padded = policy.part.padded_numel();
        let staged = self.alloc_lent::<S>(padded)?;
        // In-place all-gather: this rank's input is its own chunk.
        let chunk = policy.part.shard(self.comm.rank()).range();
        let copied = if self.params_offloaded(unit) {
            self.fetch_shard(unit, staged, chunk.start, std::mem::size_of::<S>())
        } else {
            let shard = Span::new(params, 0..chunk.len());
            self.kernels
                .copy(&mut self.arena, S::DTYPE, shard, Span::new(staged, chunk))
        };
        free_on_error(&mut self.arena, staged, copied)?;
        let launched = Launched::now("all-gather", unit, padded * std::mem::size_of::<S>());
        let flight = self.collectives.launch(
            &self.comm,
            &mut self.arena,
            S::DTYPE,
            InPlace::AllGather,
            staged,
        );
        let flight = free_on_error(&mut self.arena, staged, flight)?;
        self.progress.traffic.all_gather += padded as u64;
        Ok(Prefetch::new::<S>((flight, launched)))
    }

    /// Waits for prefetches that were never used (a step that ended early) and frees them.
    pub(crate) fn drop_prefetches(&mut self) -> Result<()> {
        for unit in 0..self.flights.prefetched.len() {
            if let Some(p) = self.flights.prefetched[unit].take() {
                let copy = p.finish(self)?;
                self.arena.free(copy)?;
            }
        }
        Ok(())
    }

    /// Ends a use begun by [`Engine::gather`]; the last one frees the compute copy.
    ///
    /// # Errors
    /// Unknown unit, or a release without a gather.
    pub(crate) fn release(&mut self, unit: usize) -> Result<()> {
        self.check_unit(unit)?;
        let reads_stored = self.units.policies[unit].reads_stored;
        if !reads_stored && self.units.bufs[unit].gather_refs == 0 {
            return Err(Error::Order(format!(
                "release of unit {unit} without a matching gather"
            )));
        }
        if reads_stored {
            return Ok(());
        }
        let b = &mut self.units.bufs[unit];
        b.gather_refs -= 1;
        if b.gather_refs == 0 {
            if let Some(copy) = b.gathered.take() {
                self.arena.free(copy)?;
            }
        }
        Ok(())
    }

    /// The f32 block holding `unit`'s whole parameters right now.
    pub(crate) fn param_block(&self, unit: usize) -> Result<Handle> {
        self.check_unit(unit)?;
        if self.units.policies[unit].reads_stored {
            return Ok(self.units.bufs[unit].params);
        }
        self.units.bufs[unit]
            .gathered
            .ok_or(Error::NotGathered { unit })
    }

    /// `unit`'s parameters in f32 (its `numel` elements, no padding).
    ///
    /// # Errors
    /// [`Error::NotGathered`] outside gather/release where a copy is needed.
    pub(crate) fn params(&self, unit: usize) -> Result<&[f32]> {
        let block = self.param_block(unit)?;
        Ok(&self.arena.slice::<f32>(block)?[..self.units.specs[unit].numel])
    }
}
