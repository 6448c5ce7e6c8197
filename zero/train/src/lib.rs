//! The reference trainer: token data, checkpoints, the bridge that drives the bundled GPT
//! (`zero-gpt`) through the ZeRO engine (`zero`), and the `zero-train` binary's library.
#![warn(missing_docs)]

pub mod bridge;
pub mod bytesize;
pub mod checkpoint;
pub mod config;
pub mod data;
pub mod error;
mod fsio;
mod llmc_header;
pub mod metrics;
pub mod resume;
pub mod run;

pub use bytesize::ByteSize;
pub use config::{Backend, ConfigError, PrecisionArg, TrainArgs, TrainConfig};
pub use error::TrainError;
pub use run::{model_config, train, RunSummary};
