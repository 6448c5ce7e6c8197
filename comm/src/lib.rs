//! Collectives for ZeRO: one [`Communicator`] API over in-process threads (the [`local`]
//! backend), processes joined over TCP through rank 0 ([`tcp`], torchrun's launch variables)
//! and MPI processes (`mpi`, feature `mpi`), and a device-buffer communicator over NCCL
//! (`nccl::NcclComm`, feature `cuda`).
//!
//! - Blocking collectives over plain slices `&[T]` / `&mut [T]` (`T` = `f32`, `bf16`, `f16`,
//!   `i32`, `i64`, `f64`; halves reduce in f32, integer sums wrap, avg is for floats only),
//!   in-place and out-of-place, sum/avg/max/min, and `split` for data-parallel x
//!   model-parallel grids.
//! - Non-blocking forms that take owned buffers and return them from [`Work::wait`],
//!   completed in issue order by a progress thread per communicator.
//! - [`ShardBuckets`]: the layout that reduces a partitioned tensor in fixed-size buckets.
//! - Timeouts, fail-fast on dead ranks, mismatch detection, counters and history.
//! - [`bootstrap`]: torchrun's launch variables and a TCP rendezvous that moves an opaque id
//!   (NCCL's unique id) from rank 0 to the other ranks; no GPU needed.
//! - `nccl` (feature `cuda`): collectives over cudarc device buffers, launched in groups on
//!   the communicator's stream, each completing on an event; created from torchrun's
//!   variables or (with `mpi`) over MPI. Asking for it where the driver, a GPU or `libnccl`
//!   is missing returns [`CommError::Unavailable`]. It has not yet run on a GPU.
//!
//! # Examples
//! ```
//! use zero_comm::{local, ReduceOp};
//!
//! let comms = local::create(4)?;
//! std::thread::scope(|s| {
//!     for comm in comms {
//!         s.spawn(move || -> zero_comm::Result<()> {
//!             let r = comm.rank() as f32;
//!             let grads = vec![r; 8]; // padded to a multiple of 4 ranks
//!             let mut shard = vec![0.0; 2];
//!             comm.reduce_scatter(&grads, &mut shard, ReduceOp::Sum)?;
//!             assert_eq!(shard, vec![6.0; 2]); // 0 + 1 + 2 + 3
//!             let mut full = vec![0.0; 8];
//!             comm.all_gather(&shard, &mut full)?;
//!             assert_eq!(full, vec![6.0; 8]);
//!             Ok(())
//!         });
//!     }
//! });
//! # Ok::<(), zero_comm::CommError>(())
//! ```
#![warn(missing_docs)]

mod backend;
pub mod bootstrap;
mod bucket;
mod chunk;
mod communicator;
mod communicator_staging;
mod config;
pub mod device_local;
mod dtype;
mod element;
mod error;
pub mod fault;
pub mod local;
#[cfg(feature = "mpi")]
pub mod mpi;
#[cfg(feature = "cuda")]
pub mod nccl;
mod op;
mod record;
mod reduce_op;
mod scope;
pub mod tcp;
mod work;

pub use backend::{Backend, Leave};
pub use bucket::{Bucket, ShardBuckets};
pub use communicator::{Collective, Communicator};
pub use communicator_staging::{StagingLayout, StagingRule};
pub use config::Config;
pub use dtype::{BufMut, BufRef, DType};
pub use element::{Accumulator, Element, F32Element};
pub use error::{BreakCause, CommError, Result};
pub use fault::{Fault, FaultAction};
pub use op::{OpDesc, OpKind};
pub use record::{ring_bytes, History, OpRecord, Stats};
pub use reduce_op::{reduce_slices, ReduceOp};
pub use scope::{Scope, ScopedWork};
pub use work::Work;

/// What [`with_element!`] expands to; not part of the API.
#[doc(hidden)]
pub mod __private {
    pub use half::{bf16, f16};
}
