//! The collectives the engine runs on model states, over blocks of its arena, behind one
//! trait, so that they run where the arena's memory is.
//!
//! The engine's passes name blocks and ranges; a [`Collectives`] implementation moves them
//! between ranks: [`HostCollectives`] hands host views of the blocks to the engine's
//! [`Communicator`] (local threads, MPI); [`DeviceLocalCollectives`] runs zero-comm's
//! device-local protocol on the blocks' addresses (ranks as threads sharing one GPU under
//! `CudaOps`, or host memory under `HostOps`, which is how the CPU tests prove it);
//! `NcclCollectives` (feature `cuda`) enqueues NCCL's collectives on the blocks' device
//! addresses, one rank per GPU.
//!
//! Decision: the trait is not `Send`, because NCCL's communicator is bound to the thread that
//! made it (zero-comm's S2): an engine over NCCL is built in its rank's thread, and what
//! crosses threads are the ingredients (a communicator's unique id, a device ordinal).
//! Rejected: an `unsafe impl Send` around the communicator.
//!
//! Decision: the engine keeps one [`Communicator`] for its control traffic (schedule
//! agreement, the overflow flag, norm partials, exports: a few scalars) and passes it to
//! every call, so a host implementation needs no communicator of its own and a device one
//! ignores it. Rejected: a second host communicator split off for model states, which would
//! double the groups (and MPI's staging) of every host run.
//!
//! A launched collective owns its block until it lands ([`Flight::land`]): the block is
//! pinned, so the arena refuses to view, move or free it meanwhile. Flights are not `Send`
//! either: an NCCL flight holds its pending work, which is bound to the communicator's
//! thread, and the engine that queues them is not `Send`.

mod device_local;
mod host;
#[cfg(feature = "cuda")]
mod nccl;
// Used by `nccl` only; compiled everywhere so that the CPU tests check its bookkeeping.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
mod stream_order;

use std::fmt::Debug;

use zero_alloc::{Arena, Handle};
use zero_comm::{Collective, Communicator, DType, ReduceOp, StagingRule};

use crate::error::{Error, Result};
use crate::kernels::Span;

pub use device_local::{BlockAddress, DeviceLocalCollectives};
pub use host::HostCollectives;
#[cfg(feature = "cuda")]
pub use nccl::NcclCollectives;

/// An in-place collective over a whole block, with NCCL's layouts: reduce-scatter leaves this
/// rank's result in chunk `rank` of the block, all-gather reads this rank's input from there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InPlace {
    /// Every element averaged over ranks (sum in rank order, then divided).
    AllReduceAvg,
    /// Chunk `rank` averaged over ranks (sum in rank order, then divided).
    ReduceScatterAvg,
    /// Every rank's chunk `rank` copied to every rank.
    AllGather,
}

impl InPlace {
    /// The collective this names.
    pub fn collective(self) -> Collective {
        match self {
            Self::AllReduceAvg => Collective::AllReduce(ReduceOp::Avg),
            Self::ReduceScatterAvg => Collective::ReduceScatter(ReduceOp::Avg),
            Self::AllGather => Collective::AllGather,
        }
    }
}

/// The byte offset of `span` (elements of `dtype`) in its block, checked to lie inside the
/// block: what an implementation adds to the block's address.
///
/// # Errors
/// [`Error::BadSpan`] naming `what`; a stale handle.
pub(crate) fn span_offset(
    arena: &Arena,
    dtype: DType,
    span: Span,
    what: &'static str,
) -> Result<u64> {
    let block_elems = arena.block(span.block)?.len / dtype.size();
    let end = span.start.checked_add(span.len);
    if end.is_none_or(|end| end > block_elems) {
        return Err(Error::BadSpan {
            kernel: what,
            message: format!(
                "elements {}..{} of a block of {block_elems}",
                span.start,
                span.start.saturating_add(span.len)
            ),
        });
    }
    Ok((span.start * dtype.size()) as u64)
}

/// A launched collective; [`Flight::land`] returns its block, unpinned, once later work on
/// the block is ordered after the collective: by a host wait (host collectives) or by the
/// arena's stream waiting for it on the device (NCCL).
#[must_use = "a launched collective keeps its block pinned until it lands"]
pub struct Flight(Box<dyn Land>);

impl Debug for Flight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Flight")
    }
}

impl Flight {
    /// Wraps an implementation's pending collective.
    pub fn new(pending: impl Land + 'static) -> Self {
        Self(Box::new(pending))
    }

    /// A collective that already ended (with `ended`) on `block`, which it pinned: landing
    /// unpins the block, then reports how the collective ended.
    pub fn finished(block: Handle, ended: Result<()>) -> Self {
        Self::new(Finished { block, ended })
    }

    /// Gives the block back to `arena` once the collective is done with it, or ordered so
    /// that whatever the arena does next comes after it.
    ///
    /// # Errors
    /// The collective's failure (timeout, a rank gone, a device error); arena errors.
    pub fn land(self, arena: &mut Arena) -> Result<Handle> {
        self.0.land(arena)
    }
}

/// What an implementation keeps of a launched collective.
pub trait Land {
    /// Gives the block back to `arena`, unpinned, as [`Flight::land`] says.
    ///
    /// # Errors
    /// As [`Flight::land`].
    fn land(self: Box<Self>, arena: &mut Arena) -> Result<Handle>;
}

/// A collective waited for at launch: its pinned block, and how it ended.
struct Finished {
    block: Handle,
    ended: Result<()>,
}

impl Land for Finished {
    fn land(self: Box<Self>, arena: &mut Arena) -> Result<Handle> {
        arena.unpin(self.block)?;
        self.ended?;
        Ok(self.block)
    }
}

/// The engine's collectives over model states. `comm` is the engine's communicator, for
/// implementations that run on it; `dtype` is the element type of the blocks.
pub trait Collectives: Debug {
    /// Short name for logs (`host`, `device-local`, `nccl`).
    fn name(&self) -> &'static str;

    /// How the collectives stage data in the arena; the plan reserves it and the engine
    /// hands the staging block to `comm`. The default, [`StagingRule::None`], is for
    /// collectives that use the engine's blocks in place.
    fn staging_rule(&self, comm: &Communicator) -> StagingRule {
        let _ = comm;
        StagingRule::None
    }

    /// All-gather of `src` (this rank's input) into `dst` (every rank's input in rank
    /// order, `world * src.len` elements), finished when it returns.
    ///
    /// # Errors
    /// Collective failures; arena errors; spans that do not fit.
    fn all_gather(
        &mut self,
        comm: &Communicator,
        arena: &mut Arena,
        dtype: DType,
        src: Span,
        dst: Span,
    ) -> Result<()>;

    /// Launches `op` in place over the whole of `block`, which stays pinned until the
    /// returned [`Flight`] lands.
    ///
    /// # Errors
    /// As [`Collectives::all_gather`]; a block already pinned.
    fn launch(
        &mut self,
        comm: &Communicator,
        arena: &mut Arena,
        dtype: DType,
        op: InPlace,
        block: Handle,
    ) -> Result<Flight>;

    /// Waits on the host for every collective that landed in stream order but may still run
    /// on the device, surfacing its failure or timeout. The engine calls it at the optimizer
    /// step, before any host read that would otherwise block on a collective with no
    /// timeout (a dead peer). The default has nothing pending.
    ///
    /// # Errors
    /// The first such collective's failure or timeout.
    fn settle(&mut self) -> Result<()> {
        Ok(())
    }
}
