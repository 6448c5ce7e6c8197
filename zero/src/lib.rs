//! ZeRO: partitioned optimizer states, gradients and parameters, and the bundled GPT-2 trainer.
#![warn(missing_docs)]

pub mod checkpoint;
pub mod data;
pub mod engine;
pub mod gpt;
pub mod llmc_header;
pub mod optim;
pub mod train;
