//! Transient blocks (compute copies, gradients, staged buckets and gathers) and what the
//! engine does when the arena has the bytes for one but no hole that fits.
//!
//! Blocks lent to collectives in flight are pinned: compaction cannot move them, so each can
//! leave a hole on either side. When an allocation fails although the free bytes would do,
//! the engine lands every collective in flight (reductions completed, prefetched gathers taken
//! back unpinned), which leaves only the model's borrowed blocks pinned, and they sit right
//! after the model states (see `allocate_units`); the arena's compaction then gathers all free
//! space into one hole. So a cap at the plan never fails on fragmentation, and what the
//! overlap loses is counted in the arena's defragmentation statistics.

use super::engine::Engine;
use super::error::Result;
use zero_alloc::{AllocError, Arena, Handle};

/// Frees `h`, a block `result` was computed with, and returns `result`: its error first, so
/// a failing free never hides the failure that came before it.
pub(crate) fn free_after<R>(arena: &mut Arena, h: Handle, result: Result<R>) -> Result<R> {
    let freed = arena.free(h);
    let value = result?;
    freed?;
    Ok(value)
}

/// Keeps `h` for the caller when `result` is a success and frees it when it is a failure,
/// whose error wins over the free's.
pub(crate) fn free_on_error<R>(arena: &mut Arena, h: Handle, result: Result<R>) -> Result<R> {
    if result.is_err() {
        let _ = arena.free(h);
    }
    result
}

impl Engine {
    /// A transient block of `len` elements of `T` (stale contents), best fit from below.
    pub(crate) fn alloc_transient<T: bytemuck::Pod>(&mut self, len: usize) -> Result<Handle> {
        self.alloc_with(len, Arena::alloc_elems::<T>)
    }

    /// A transient block about to be lent to a collective: from the top of the arena, where
    /// such blocks stack and refill each other's holes (they are mostly whole buckets of one
    /// size) instead of splitting the free space the other transients use.
    pub(crate) fn alloc_lent<T: bytemuck::Pod>(&mut self, len: usize) -> Result<Handle> {
        self.alloc_with(len, Arena::alloc_elems_high::<T>)
    }

    fn alloc_with(
        &mut self,
        len: usize,
        alloc: fn(&mut Arena, usize) -> zero_alloc::Result<Handle>,
    ) -> Result<Handle> {
        match alloc(&mut self.arena, len) {
            Err(AllocError::OutOfMemory { .. }) if self.config.defragment && self.lends_out() => {
                self.land_in_flight()?;
                Ok(alloc(&mut self.arena, len)?)
            }
            other => Ok(other?),
        }
    }

    /// Some collective holds a pinned block of the arena.
    fn lends_out(&self) -> bool {
        !self.flights.reductions.is_empty() || self.flights.prefetched.iter().any(Option::is_some)
    }

    /// Completes every reduction in flight and lands every prefetched gather.
    fn land_in_flight(&mut self) -> Result<()> {
        self.complete_reductions(0)?;
        for unit in 0..self.flights.prefetched.len() {
            if let Some(mut prefetch) = self.flights.prefetched[unit].take() {
                let landed = prefetch.land(self);
                self.flights.prefetched[unit] = Some(prefetch);
                landed?;
            }
        }
        Ok(())
    }
}
