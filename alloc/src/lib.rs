//! Memory for ZeRO: contiguous arenas with handles and defragmentation, pinned host memory,
//! and asynchronous offload copies.
#![warn(missing_docs)]
