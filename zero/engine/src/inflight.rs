//! Gradient reductions in flight: launched on the communicator's progress thread when a
//! unit's backward ends, accumulated when they complete, in launch order.
//!
//! The staged gradient is an arena block lent to the collective ([`zero_alloc::Lent`]): the
//! arena keeps it pinned (not viewed, moved or freed) until the reduction hands it back, so
//! the overlap costs no copy and every byte stays measured.

use super::collectives::Flight;
use super::engine::Engine;
use super::error::Result;
use super::kernels::Span;
use super::precision::Store;
use super::trace::Launched;
use super::transient::{free_after, free_on_error};
use std::marker::PhantomData;
use zero_alloc::Handle;
use zero_comm::{Bucket, ShardBuckets};

pub use super::planning::MAX_IN_FLIGHT;

/// One launched reduction, type-erased over the storage element so the engine can queue
/// reductions of any precision together.
pub(crate) struct InFlight(Box<dyn Pending>);

impl std::fmt::Debug for InFlight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InFlight")
            .field("unit", &self.0.unit())
            .finish()
    }
}

impl InFlight {
    /// Bucket `bucket` of `unit`, laid out by `layout`, launched as `launched` says.
    pub fn new<S: Store>(
        unit: usize,
        layout: ShardBuckets,
        bucket: Bucket,
        (flight, launched): (Flight, Launched),
    ) -> Self {
        Self(Box::new(Reduction::<S> {
            unit,
            layout,
            bucket,
            flight,
            launched,
            _store: PhantomData,
        }))
    }

    /// Waits for the reduction and accumulates its result.
    pub fn finish(self, engine: &mut Engine) -> Result<()> {
        self.0.finish(engine)
    }
}

trait Pending {
    fn unit(&self) -> usize;
    fn finish(self: Box<Self>, engine: &mut Engine) -> Result<()>;
}

struct Reduction<S> {
    unit: usize,
    layout: ShardBuckets,
    bucket: Bucket,
    flight: Flight,
    launched: Launched,
    _store: PhantomData<fn() -> S>,
}

impl<S: Store> Pending for Reduction<S> {
    fn unit(&self) -> usize {
        self.unit
    }

    fn finish(self: Box<Self>, engine: &mut Engine) -> Result<()> {
        let staged = self.flight.land(&mut engine.arena)?;
        engine.trace_landed(&self.launched);
        engine.accumulate_reduced::<S>(self.unit, self.layout, self.bucket, staged)
    }
}

/// A stage-3 all-gather launched ahead of its unit's `gather`, type-erased like [`InFlight`],
/// and its launch until it lands.
pub(crate) struct Prefetch(Box<dyn PendingGather>, Option<Launched>);

impl std::fmt::Debug for Prefetch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Prefetch")
    }
}

impl Prefetch {
    pub fn new<S: Store>((flight, launched): (Flight, Launched)) -> Self {
        Self(Box::new(Gather::<S>::Flying(flight)), Some(launched))
    }

    /// Waits for the all-gather and takes its staged block back (unpinned, so compaction may
    /// move it), keeping it until the unit's `gather`.
    pub fn land(&mut self, engine: &mut Engine) -> Result<()> {
        self.0.land(engine)?;
        if let Some(launched) = self.1.take() {
            engine.trace_landed(&launched);
        }
        Ok(())
    }

    /// Waits for the all-gather and returns the unit's f32 compute copy.
    pub fn finish(mut self, engine: &mut Engine) -> Result<Handle> {
        self.land(engine)?;
        self.0.finish(engine)
    }
}

trait PendingGather {
    fn land(&mut self, engine: &mut Engine) -> Result<()>;
    /// The compute copy of a landed gather.
    fn finish(self: Box<Self>, engine: &mut Engine) -> Result<Handle>;
}

enum Gather<S> {
    Flying(Flight),
    Landed(Handle),
    /// Between the two, while the wait runs (never observed outside `land`).
    Waiting(PhantomData<fn() -> S>),
}

impl<S: Store> PendingGather for Gather<S> {
    fn land(&mut self, engine: &mut Engine) -> Result<()> {
        match std::mem::replace(self, Self::Waiting(PhantomData)) {
            Self::Flying(flight) => {
                *self = Self::Landed(flight.land(&mut engine.arena)?);
            }
            landed => *self = landed,
        }
        Ok(())
    }

    fn finish(self: Box<Self>, engine: &mut Engine) -> Result<Handle> {
        let Self::Landed(staged) = *self else {
            return Err(crate::Error::Order(
                "a prefetch finished before it landed".into(),
            ));
        };
        // f32 storage gathered straight into what the model reads.
        if std::mem::size_of::<S>() == 4 {
            return Ok(staged);
        }
        let len = engine.arena.block(staged)?.len / std::mem::size_of::<S>();
        let copy = engine.alloc_transient::<f32>(len)?;
        let widened = engine.kernels.widen(
            &mut engine.arena,
            S::DTYPE,
            Span::new(staged, 0..len),
            Span::new(copy, 0..len),
            1.0,
        );
        let widened = free_after(&mut engine.arena, staged, widened);
        free_on_error(&mut engine.arena, copy, widened.map(|()| copy))
    }
}
