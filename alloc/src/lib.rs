//! Memory for ZeRO: contiguous arenas with handles and defragmentation, pinned host memory,
//! and asynchronous offload copies.
//!
//! Every parameter, gradient and optimizer buffer of a rank lives in one [`Arena`]: a single
//! reservation with a capacity cap (so a CPU run can emulate a 16 GB or 80 GB device),
//! best-fit placement with coalescing frees, compaction by [`Arena::defragment`], and exact
//! [`Stats`]. Blocks are named by [`Handle`]s, which survive compaction and turn double frees
//! and foreign handles into errors. An accounting arena does the same bookkeeping with no
//! memory behind it, so a planner can place a trillion-parameter model on a laptop.
//!
//! ```
//! use zero_alloc::{Arena, AllocError};
//!
//! let mut arena = Arena::host(4096)?; // alignment 256: 16 units
//! let a = arena.alloc(1000)?; // 4 units
//! let b = arena.alloc(1000)?;
//! let c = arena.alloc(1000)?;
//! arena.slice_mut::<u8>(c)?.fill(7);
//! arena.free(a)?;
//! arena.free(b)?; // coalesces with a's hole
//! assert_eq!(arena.stats().largest_free, 2048);
//! arena.defragment()?;
//! assert_eq!(arena.block(c)?.offset, 0);
//! assert!(arena.slice::<u8>(c)?.iter().all(|&x| x == 7));
//! let oom = arena.alloc(1 << 20).unwrap_err();
//! assert!(matches!(oom, AllocError::OutOfMemory { .. }));
//! println!("{oom}"); // request, capacity, holes, fragmentation
//! # Ok::<(), AllocError>(())
//! ```
//!
//! With the feature `cuda`, arenas hold CUDA device memory too, `CudaLibrary` checks for
//! the CUDA libraries before cudarc loads them, and [`nvrtc`] compiles and caches the
//! workspace's run-time-compiled kernels per device.
#![warn(missing_docs)]

mod arena;
mod bytesize;
mod config;
#[cfg(feature = "cuda")]
pub mod context;
#[cfg(feature = "cuda")]
mod cuda;
mod device;
mod error;
mod free_list;
mod handle;
mod host_memory;
mod lend;
#[cfg(feature = "cuda")]
mod libraries;
mod memory;
// Pure planning, compiled (and tested) without the feature; only the CUDA arena runs a plan.
#[cfg_attr(
    not(feature = "cuda"),
    allow(dead_code, reason = "only the CUDA arena's moves run a plan")
)]
mod move_plan;
pub mod nvrtc;
mod offload;
mod pinned;
mod stats;
mod storage;
#[doc(hidden)]
pub mod testing;
pub mod tier;
mod view;

pub use arena::{Arena, DefragReport};
pub use bytesize::{ByteSize, ByteSizeError};
pub use config::{ArenaConfig, Backing, DEFAULT_ALIGNMENT};
pub use device::Device;
pub use error::{AllocError, Result};
pub use handle::{Block, Handle};
pub use host_memory::{
    host_available_bytes, host_memory_description, host_memory_name, host_memory_override,
    HOST_MEMORY_VAR,
};
pub use lend::Lent;
#[cfg(feature = "cuda")]
pub use lend::LentDevice;
#[cfg(feature = "cuda")]
pub use libraries::CudaLibrary;
pub use offload::{offload_double_buffered, Chunk, CopyEngine, CopyTiming, Transfer};
pub use pinned::PinnedBuffer;
pub use stats::{human_bytes, Stats};
pub use view::Views;
#[cfg(feature = "cuda")]
pub use view::{DeviceView, DeviceViewMut};
