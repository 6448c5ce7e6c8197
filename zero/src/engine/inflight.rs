//! Gradient reductions in flight: launched on the communicator's progress thread when a
//! unit's backward ends, accumulated when they complete, in launch order.
//!
//! The staged gradient is an arena block lent to the collective ([`zero_alloc::Lent`]): the
//! arena keeps it pinned (not viewed, moved or freed) until the reduction hands it back, so
//! the overlap costs no copy and every byte stays measured.

use super::error::Result;
use super::state::Engine;
use super::storage::Store;
use zero_alloc::Lent;
use zero_comm::Work;

/// Reductions allowed in flight before `end_backward` waits for the oldest. Two keep the
/// communicator busy behind one unit of backward without letting staged gradients pile up;
/// the memory plan reserves room for them.
pub const MAX_IN_FLIGHT: usize = 2;

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
    pub fn new<S: Store>(unit: usize, work: Work<Lent<S>>) -> Self {
        Self(Box::new(Reduction { unit, work }))
    }

    pub fn is_done(&self) -> bool {
        self.0.is_done()
    }

    /// Waits for the reduction and accumulates its result.
    pub fn finish(self, engine: &mut Engine) -> Result<()> {
        self.0.finish(engine)
    }
}

trait Pending: Send {
    fn unit(&self) -> usize;
    fn is_done(&self) -> bool;
    fn finish(self: Box<Self>, engine: &mut Engine) -> Result<()>;
}

struct Reduction<S> {
    unit: usize,
    work: Work<Lent<S>>,
}

impl<S: Store> Pending for Reduction<S> {
    fn unit(&self) -> usize {
        self.unit
    }

    fn is_done(&self) -> bool {
        self.work.is_done()
    }

    fn finish(self: Box<Self>, engine: &mut Engine) -> Result<()> {
        let lent = self.work.wait()?;
        let staged = engine.arena.take_back(lent)?;
        engine.accumulate_reduced::<S>(self.unit, staged)
    }
}
