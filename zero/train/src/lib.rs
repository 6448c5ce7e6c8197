//! The reference trainer: token data, checkpoints, the bridge that drives the bundled GPT
//! (`zero-gpt`) through the ZeRO engine (`zero`), and the `zero-train` binary's library.
#![warn(missing_docs)]

pub mod args;
pub mod bridge;
pub mod checkpoint;
pub mod config;
pub mod data;
pub mod device;
pub mod elastic;
pub mod error;
pub mod export;
pub mod fault;
mod fsio;
pub mod init;
mod launch;
pub mod link_rate;
mod llmc_header;
pub mod memory_fit;
pub mod metrics;
pub mod offload;
pub mod plan_report;
mod progress;
mod report;
pub mod resident;
pub mod resume;
pub mod run;
mod sample;
mod sharded_save;
mod trainer;
pub mod validate;

pub use args::TrainArgs;
pub use config::{Backend, Device, PrecisionArg, TrainConfig};
pub use error::{ConfigError, TrainError};
pub use run::{train, RunSummary};
pub use zero_alloc::ByteSize;
