//! The reference trainer, by concern: what the user types ([`cli`]), the memory and traffic
//! a run would need ([`plan`]), the run itself and its ranks ([`run`]), token data
//! ([`data`]), model files and training states ([`checkpoint`]), the bridge that drives the
//! bundled GPT (`zero-gpt`) through the ZeRO engine (`zero`) ([`bridge`]; activation
//! checkpointing's kept inputs and their offload are the engine's), and the errors of them all
//! ([`error`]).
#![warn(missing_docs)]

pub mod bridge;
pub mod checkpoint;
pub mod cli;
pub mod data;
pub mod error;
mod llmc_header;
pub mod plan;
pub mod run;

pub use cli::args::TrainArgs;
pub use cli::config::{Backend, Device, OffloadTier, PrecisionArg, TrainConfig};
pub use error::{ConfigError, TrainError};
pub use run::{train, RunSummary};
pub use zero_alloc::ByteSize;
// Token files and model files are written and named like training states.
use zero_state::fsio;
