//! The bundled trainer: `zero-train`'s configuration, and the GPT driven through the engine.

pub mod bytesize;
pub mod config;
pub mod error;
pub mod gpt_engine;
pub mod metrics;
pub mod resume;
pub mod run;

pub use bytesize::ByteSize;
pub use config::{Backend, ConfigError, PrecisionArg, TrainArgs, TrainConfig};
pub use error::TrainError;
pub use run::{model_config, train, RunSummary};
