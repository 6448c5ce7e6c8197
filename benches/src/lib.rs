//! Shared helpers for the project's benchmarks: the engine of `zero-bench` (an nccl-tests
//! style collective benchmark), its size parsing, and the memcpy baseline.
#![warn(missing_docs)]

pub mod collective;
#[cfg(feature = "cuda")]
pub mod device_local;
pub mod memcpy;
#[cfg(feature = "cuda")]
pub mod nccl;
pub mod size;
