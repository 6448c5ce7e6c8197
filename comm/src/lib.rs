//! Collectives for ZeRO: one `Communicator` API over in-process threads, MPI and NCCL.
#![warn(missing_docs)]
