//! A collective that runs on another stream than the arena's and is ordered against the
//! arena's stream by events, without a host wait at launch or landing: the bookkeeping
//! `NcclCollectives` follows, written once over [`StreamWork`] so that CPU tests check it
//! with a recording fake.
//!
//! Protocol for one launched block (the soundness argument is N0-N4 in `nccl.rs`):
//! 1. launch: the collective's stream waits for the arena's (an event), the block is pinned,
//!    the collective is enqueued, and a [`StreamFlight`] keeps the block and the work;
//! 2. land: the arena's stream waits for the work ([`StreamWork::order_before_arena`]), the
//!    block is unpinned, and the work is polled once: a failure is returned, a work still
//!    running joins the collectives' [`Unsettled`] queue;
//! 3. the collectives poll that queue at every later launch and wait for it at every
//!    blocking call, so a failure or a timeout of a landed collective is reported there;
//! 4. a flight dropped without landing waits for its work on the host and leaves its block
//!    pinned, so the arena never moves, reuses or frees bytes the collective may still write.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;

use zero_alloc::{Arena, Handle};

use super::Land;
use crate::error::Result;

/// A collective enqueued on a stream other than the arena's.
pub(crate) trait StreamWork: Sized {
    /// Makes the arena's stream wait, on the device, until the collective finished.
    fn order_before_arena(&self, arena: &Arena) -> Result<()>;
    /// Never blocks: `None` once the collective finished, `Some(self)` while it runs.
    ///
    /// # Errors
    /// The collective failed, or is unfinished past its timeout.
    fn poll(self) -> Result<Option<Self>>;
    /// Blocks until the collective finished, bounded by its timeout.
    ///
    /// # Errors
    /// As [`StreamWork::poll`].
    fn wait(self) -> Result<()>;
}

/// Collectives that landed (their blocks unpinned, the arena's stream ordered after them)
/// and were not yet seen to finish, oldest first; shared by the flights and their
/// collectives.
pub(crate) struct Unsettled<W>(Rc<RefCell<VecDeque<W>>>);

impl<W> Clone for Unsettled<W> {
    fn clone(&self) -> Self {
        Self(Rc::clone(&self.0))
    }
}

impl<W> std::fmt::Debug for Unsettled<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Unsettled({})", self.len())
    }
}

impl<W> Unsettled<W> {
    /// How many are queued.
    pub fn len(&self) -> usize {
        self.0.borrow().len()
    }
}

impl<W: StreamWork> Unsettled<W> {
    pub fn new() -> Self {
        Self(Rc::new(RefCell::new(VecDeque::new())))
    }

    fn push(&self, work: W) {
        self.0.borrow_mut().push_back(work);
    }

    /// Polls every queued collective without blocking; drops the finished ones.
    ///
    /// # Errors
    /// The first failure or timeout; the collectives after it stay queued.
    pub fn poll(&self) -> Result<()> {
        let mut queue = self.0.borrow_mut();
        for _ in 0..queue.len() {
            let Some(work) = queue.pop_front() else { break };
            if let Some(running) = work.poll()? {
                queue.push_back(running);
            }
        }
        Ok(())
    }

    /// Waits for every queued collective, oldest first.
    ///
    /// # Errors
    /// The first failure or timeout; the rest are dropped unwaited (a failed wait has
    /// stopped the collectives, which is `StreamWork`'s contract with its implementations).
    pub fn wait_all(&self) -> Result<()> {
        let drained: Vec<W> = self.0.borrow_mut().drain(..).collect();
        for work in drained {
            work.wait()?;
        }
        Ok(())
    }
}

/// A launched collective on a pinned block; see the module's protocol.
pub(crate) struct StreamFlight<W: StreamWork> {
    block: Handle,
    /// `Some` until it lands; `Drop` waits for what is left.
    work: Option<W>,
    unsettled: Unsettled<W>,
}

impl<W: StreamWork> StreamFlight<W> {
    /// `work` runs on `block`, which the caller pinned before enqueueing it.
    pub fn new(block: Handle, work: W, unsettled: Unsettled<W>) -> Self {
        Self {
            block,
            work: Some(work),
            unsettled,
        }
    }
}

impl<W: StreamWork> Land for StreamFlight<W> {
    fn land(mut self: Box<Self>, arena: &mut Arena) -> Result<Handle> {
        let Some(work) = self.work.take() else {
            return Err(crate::Error::Order("a flight landed twice".into()));
        };
        if let Err(ordering) = work.order_before_arena(arena) {
            // Without the event the block is only safe once the collective finished.
            work.wait()?;
            arena.unpin(self.block)?;
            return Err(ordering);
        }
        arena.unpin(self.block)?;
        if let Some(running) = work.poll()? {
            self.unsettled.push(running);
        }
        Ok(self.block)
    }
}

impl<W: StreamWork> Drop for StreamFlight<W> {
    fn drop(&mut self) {
        let Some(work) = self.work.take() else { return };
        let waited = work.wait();
        tracing::warn!(
            block = ?self.block,
            ?waited,
            "a collective's flight was dropped without landing: waited for it on the host; \
             its block stays pinned in the arena"
        );
    }
}

#[cfg(test)]
#[path = "stream_order_tests.rs"]
mod tests;
