//! The trait every backend implements.
//!
//! Decision: `Communicator` is one concrete type over `Box<dyn Backend>`, an object-safe trait
//! whose methods take dtype-tagged buffers ([`BufRef`] / [`BufMut`]). Rejected: an enum of
//! backends, which makes every method a `match` over `#[cfg]`-gated variants (candle's weak
//! spot) and closes the set; and a generic trait (`fn all_reduce<T>`), which is not
//! object-safe. MPI maps a tag to a datatype (u16 + a user op for halves), NCCL to
//! `ncclDataType_t`; device buffers would arrive as a new variant of the buffer enums.

use std::fmt::Debug;
use std::sync::Arc;

use zero_alloc::Lent;

use crate::communicator_staging::{StagingLayout, StagingRule};
use crate::dtype::{BufMut, BufRef};
use crate::error::{CommError, Result};
use crate::op::OpDesc;
use crate::reduce_op::ReduceOp;

/// One rank's endpoint of a group. Lengths have been checked against `desc` by the caller,
/// and so has the reduction against the element type ([`ReduceOp::supports`]); the backend
/// checks that ranks agree.
///
/// In-place calls pass `send = None`; the layouts are NCCL's: in-place reduce-scatter leaves
/// rank r's result at chunk r of `recv`, in-place all-gather reads rank r's input from chunk r.
pub trait Backend: Send + Debug {
    /// Short name (`local`, `mpi`, `nccl`).
    fn name(&self) -> &'static str;
    /// This rank, in `0..size`.
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn size(&self) -> usize;
    /// See [`Communicator::all_reduce`](crate::Communicator::all_reduce).
    ///
    /// # Errors
    /// Timeouts, broken groups and mismatches, as [`CommError`](crate::CommError) describes.
    fn all_reduce(
        &mut self,
        desc: &OpDesc,
        send: Option<BufRef<'_>>,
        recv: BufMut<'_>,
        op: ReduceOp,
    ) -> Result<()>;
    /// See [`Communicator::reduce_scatter`](crate::Communicator::reduce_scatter).
    ///
    /// # Errors
    /// As [`Backend::all_reduce`].
    fn reduce_scatter(
        &mut self,
        desc: &OpDesc,
        send: Option<BufRef<'_>>,
        recv: BufMut<'_>,
        op: ReduceOp,
    ) -> Result<()>;
    /// See [`Communicator::all_gather`](crate::Communicator::all_gather).
    ///
    /// # Errors
    /// As [`Backend::all_reduce`].
    fn all_gather(
        &mut self,
        desc: &OpDesc,
        send: Option<BufRef<'_>>,
        recv: BufMut<'_>,
    ) -> Result<()>;
    /// See [`Communicator::broadcast`](crate::Communicator::broadcast).
    ///
    /// # Errors
    /// As [`Backend::all_reduce`].
    fn broadcast(
        &mut self,
        desc: &OpDesc,
        send: Option<BufRef<'_>>,
        recv: BufMut<'_>,
        root: usize,
    ) -> Result<()>;
    /// See [`Communicator::reduce`](crate::Communicator::reduce).
    ///
    /// # Errors
    /// As [`Backend::all_reduce`].
    fn reduce(
        &mut self,
        desc: &OpDesc,
        send: Option<BufRef<'_>>,
        recv: BufMut<'_>,
        op: ReduceOp,
        root: usize,
    ) -> Result<()>;
    /// See [`Communicator::barrier`](crate::Communicator::barrier).
    ///
    /// # Errors
    /// As [`Backend::all_reduce`].
    fn barrier(&mut self, desc: &OpDesc) -> Result<()>;
    /// See [`Communicator::split`](crate::Communicator::split).
    ///
    /// # Errors
    /// As [`Backend::all_reduce`].
    fn split(&mut self, desc: &OpDesc, color: u32, key: u32) -> Result<Box<dyn Backend>>;
    /// A handle that marks this rank as gone, usable while an operation holds the backend.
    fn leave_handle(&self) -> Arc<dyn Leave>;
    /// How the backend stages collectives; the default stages nothing.
    fn staging_rule(&self) -> StagingRule {
        StagingRule::None
    }
    /// Takes `block` to stage collectives in, carved as `layout` (a non-empty layout of
    /// [`Backend::staging_rule`]); see
    /// [`Communicator::provide_staging`](crate::Communicator::provide_staging).
    ///
    /// # Errors
    /// A backend that stages nothing refuses any block.
    fn provide_staging(&mut self, block: Lent<u64>, layout: StagingLayout) -> Result<()> {
        let _ = (block, layout);
        Err(CommError::InvalidArgument {
            what: format!("the {} backend stages nothing", self.name()),
        })
    }
    /// Staging bytes held outside the provided block; the default stages nothing.
    fn staging_outside_bytes(&self) -> u64 {
        0
    }
}

/// Marks a rank as gone so its peers' pending and future collectives fail instead of hanging.
pub trait Leave: Send + Sync + Debug {
    /// Called once, from the communicator's `Drop`; `panicked` when the thread is unwinding.
    fn leave(&self, panicked: bool);
}
