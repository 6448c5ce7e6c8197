//! The bundled trainer's run-level pieces: configuration of `zero-train`.

pub mod bytesize;
pub mod config;

pub use bytesize::ByteSize;
pub use config::{Backend, ConfigError, PrecisionArg, TrainArgs, TrainConfig};
