//! Shared helpers for the project's benchmarks.
#![warn(missing_docs)]
