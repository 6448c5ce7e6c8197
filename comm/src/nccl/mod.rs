//! The NCCL backend (feature `cuda`): collectives over *device* buffers, one rank per GPU,
//! through `cudarc::nccl` (NCCL loaded at run time).
//!
//! Decision: a separate communicator type, [`NcclComm`], whose collectives take cudarc device
//! buffers (`CudaSlice`, `CudaView`, `CudaViewMut`) and return an event-backed [`NcclWork`].
//! Rejected: device variants of `BufRef`/`BufMut` behind the host [`Communicator`](crate::Communicator),
//! which would push CUDA types into every backend's `match`, run NCCL from the progress thread
//! (NCCL's communicator is bound to one thread here) and hide stream order behind host waits.
//!
//! Protocol for one launch (a [`Group`] of one or more collectives) on rank r:
//! 1. plan each collective from its buffers' lengths (`layout::plan`), taking each device
//!    pointer on the communicator's stream; the workspace's contexts have cudarc's event
//!    tracking off (`zero_alloc::context`), so [`NcclComm::wait_for`] orders the launch after
//!    the buffers' writers on other streams (a buffer from a context with tracking on also
//!    gets cudarc's wait);
//! 2. `ncclGroupStart`, enqueue every collective, `ncclGroupEnd`: NCCL fuses them;
//! 3. the communicator is non-blocking, so poll `ncclCommGetAsyncError` until the launch has
//!    left `ncclInProgress`;
//! 4. record an event on the stream: the [`NcclWork`] completes when it does; waiting polls the
//!    event and `ncclCommGetAsyncError`, and past the group's timeout aborts the communicator
//!    (`abort.rs`, every abort's one path: an abort in progress is polled to its end, bounded
//!    in time, and a failed or unfinished one is logged and returned).
//!
//! Soundness, which every `// SAFETY:` comment in this module cites:
//! - S1 (live handle): the raw `ncclComm_t` is used only between its successful creation and
//!   its abort or destruction; every use goes through `Handle::raw`, which fails once the handle
//!   was aborted (abort nulls it), and `Drop` is the only other user.
//! - S2 (one thread): the handle lives in an `Rc`, so a communicator and its works are neither
//!   `Send` nor `Sync`; NCCL never sees concurrent calls on one communicator from us.
//! - S3 (bounds): every pointer handed to NCCL is a cudarc device pointer plus an offset that
//!   `layout::plan` proved keeps NCCL's reads and writes inside that buffer's length; NCCL's
//!   scalar arguments (count, type, op, root < size) come from the same plan.
//! - S4 (lifetime): enqueued work may outlive the call. cudarc frees device memory in stream
//!   order after the read/write events the pointer guards record, and the guards are dropped
//!   only after the enqueue (so the events cover NCCL's kernels); with event tracking off, the
//!   caller orders later uses by [`NcclWork::wait`] or [`NcclWork::then`], the same contract as
//!   cudarc's own `nccl::Comm`. After a timeout the communicator is aborted, which stops its
//!   kernels, before the error returns.
//!
//! Nothing in this module has run on a GPU yet (see `docs/nccl.md`).

mod abort;
mod comm;
mod enqueue;
mod ffi;
mod group;
mod handle;
mod init;
mod layout;
#[cfg(feature = "mpi")]
mod mpi;
mod split;
mod work;

pub use comm::{available, new_id, NcclComm, UniqueId};
pub use group::{Group, RawDeviceBuf};
pub use work::NcclWork;
