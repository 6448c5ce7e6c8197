//! The bundled trainer: `zero-train`'s configuration, and the GPT driven through the engine.

pub mod bytesize;
pub mod config;
pub mod gpt_engine;

pub use bytesize::ByteSize;
pub use config::{Backend, ConfigError, PrecisionArg, TrainArgs, TrainConfig};
