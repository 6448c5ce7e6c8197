//! The crate's one error type.

use crate::{Device, Handle, Stats};

/// Everything that can go wrong in `zero-alloc`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AllocError {
    /// No hole large enough, even after any defragmentation the arena was allowed to do.
    #[error("out of memory on {device}: requested {} ({requested} bytes, {rounded} after alignment)\n{stats}", crate::stats::human_bytes(*requested as u64))]
    OutOfMemory {
        /// The device of the arena that refused.
        device: Device,
        /// Bytes asked for.
        requested: usize,
        /// Bytes the request occupies once rounded up to the arena's alignment.
        rounded: usize,
        /// The arena's statistics at the moment of refusal.
        stats: Box<Stats>,
    },
    /// A size computation (element count times element size, alignment rounding) overflowed.
    #[error("size overflow: {count} elements of {elem_size} bytes")]
    SizeOverflow {
        /// Number of elements requested.
        count: usize,
        /// Size of one element in bytes.
        elem_size: usize,
    },
    /// The arena's block table is full (u32 slots).
    #[error("too many live blocks ({live})")]
    TooManyBlocks {
        /// Live blocks at the time.
        live: usize,
    },
    /// The handle was made by a different arena.
    #[error("{handle:?} belongs to arena {handle_arena}, not to arena {arena}")]
    ForeignHandle {
        /// The offending handle.
        handle: Handle,
        /// Arena that made the handle.
        handle_arena: u64,
        /// Arena it was presented to.
        arena: u64,
    },
    /// The handle's block was freed (a double free or a use after free).
    #[error("{handle:?} is stale: its block was freed")]
    StaleHandle {
        /// The offending handle.
        handle: Handle,
    },
    /// The block is pinned by an in-flight operation.
    #[error("{handle:?} is pinned by {pins} in-flight operation(s); it cannot be {action}")]
    Pinned {
        /// The pinned block's handle.
        handle: Handle,
        /// Current pin count.
        pins: u32,
        /// What was attempted ("freed", "viewed").
        action: &'static str,
    },
    /// An unpin without a matching pin.
    #[error("{handle:?} is not pinned")]
    NotPinned {
        /// The handle.
        handle: Handle,
    },
    /// A typed view whose element type does not divide the block, or is over-aligned.
    #[error("block of {len} bytes cannot be viewed as {type_name} (size {elem_size}, align {elem_align}, arena alignment {arena_align})")]
    BadView {
        /// Block length in bytes.
        len: usize,
        /// Element type name.
        type_name: &'static str,
        /// Element size.
        elem_size: usize,
        /// Element alignment.
        elem_align: usize,
        /// The arena's alignment.
        arena_align: usize,
    },
    /// An element range of a device view that is reversed, does not fit the view, or starts
    /// at an address not aligned for its element type.
    #[error("elements {start}..{end} of {type_name} (size {elem_size}, align {elem_align}) do not fit a view of {len} bytes at {addr:#x}")]
    BadRange {
        /// The view's device address.
        addr: u64,
        /// The view's length in bytes.
        len: usize,
        /// First element asked for.
        start: usize,
        /// One past the last element asked for.
        end: usize,
        /// Element type name.
        type_name: &'static str,
        /// Element size.
        elem_size: usize,
        /// Element alignment.
        elem_align: usize,
    },
    /// The same handle was asked for twice where at least one request was mutable.
    #[error("{handle:?} is already borrowed; simultaneous views need distinct blocks")]
    AlreadyBorrowed {
        /// The handle asked for twice.
        handle: Handle,
    },
    /// The arena has no host-addressable memory (accounting mode, or device memory).
    #[error("arena on {device} has no host memory to view ({reason})")]
    NoHostMemory {
        /// The arena's device.
        device: Device,
        /// Why: "accounting mode" or "device memory".
        reason: &'static str,
    },
    /// A configuration that cannot work (alignment not a power of two, ...).
    #[error("invalid arena configuration: {reason}")]
    InvalidConfig {
        /// What is wrong.
        reason: String,
    },
    /// Reserving or locking memory failed at the OS level.
    #[error("{what} of {bytes} bytes failed: {source}")]
    Os {
        /// The operation ("reserve", "lock").
        what: &'static str,
        /// Size involved.
        bytes: usize,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A file (a prebuilt CUBIN) could not be written or read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Lengths of a copy's source and destination differ.
    #[error("copy length mismatch: source {src} bytes, destination {dst} bytes")]
    LengthMismatch {
        /// Source bytes.
        src: usize,
        /// Destination bytes.
        dst: usize,
    },
    /// A tier file could not be created, opened, read or written.
    #[error("{op} {}: {source}", path.display())]
    TierIo {
        /// The file.
        path: std::path::PathBuf,
        /// What was being done.
        op: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A tier file's disk has no room for its bytes (reserved when the file is created).
    #[error(
        "the tier file {} needs {bytes} bytes and its disk has {} free: choose a folder on a \
         disk with room",
        path.display(),
        available.map_or("less than that".to_string(), |a| a.to_string())
    )]
    TierNoSpace {
        /// The file.
        path: std::path::PathBuf,
        /// The bytes it needs.
        bytes: u64,
        /// The bytes free on its filesystem, where the OS tells.
        available: Option<u64>,
    },
    /// A tier file is not the one expected: another run's, rank's or layout's, or shorter.
    #[error("{}: its {what} is {found}, expected {expected}", path.display())]
    TierMismatch {
        /// The file.
        path: std::path::PathBuf,
        /// What differs.
        what: &'static str,
        /// What this run expected.
        expected: String,
        /// What the file holds.
        found: String,
    },
    /// The copy engine's thread is gone (it panicked or was shut down).
    #[error("copy engine is shut down")]
    CopyEngineGone,
    /// CUDA was asked for in a build without the `cuda` feature.
    #[error("{device} requested but zero-alloc was built without the `cuda` feature")]
    NotCompiledWithCuda {
        /// The device asked for.
        device: Device,
    },
    /// A CUDA library could not be found at run time.
    #[error("CUDA unavailable: {library}: {reason}")]
    CudaUnavailable {
        /// The missing library (`"libcuda"`, `"libnvrtc"`, ...).
        library: &'static str,
        /// Why, and how to provide it.
        reason: &'static str,
    },
    /// A CUDA driver call failed.
    #[error("CUDA error during {what}: {message}")]
    Cuda {
        /// The operation.
        what: &'static str,
        /// The driver's message, code included.
        message: String,
    },
    /// NVRTC rejected a kernel program.
    #[error("NVRTC could not compile {program} for {arch}: {log}")]
    Nvrtc {
        /// The program's file name.
        program: &'static str,
        /// The target architecture (`"sm_90"`, or the default target).
        arch: &'static str,
        /// The compiler's log.
        log: String,
    },
}

/// `Result` with [`AllocError`].
pub type Result<T, E = AllocError> = std::result::Result<T, E>;
