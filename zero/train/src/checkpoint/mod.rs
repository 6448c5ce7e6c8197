//! Checkpoints: llm.c's float32 model format and the trainer's own resumable state.
//!
//! - [`LlmcCheckpoint`]: the `gpt2_124M.bin`-style file of llm.c (header magic 20240326,
//!   version 3, then the sixteen parameter tensors in llm.c's order), with conversion to and
//!   from this crate's per-unit layout ([`ModelShape::unit_sizes`]).
//! - [`export_safetensors`] / [`read_safetensors`]: one safetensors file with the names and
//!   layouts of Hugging Face's GPT-2 checkpoint (plus [`write_hf_config`] for its
//!   `config.json`), written one unit at a time; [`read_sharded_safetensors`] reads HF's
//!   sharded form (`model.safetensors.index.json` and its shard files), which
//!   [`export_sharded_safetensors`] writes.
//! - A run's saving and resuming of its training state ([`resume`]): the run's position
//!   beside the engine's states, which zero-state saves and loads (one piece file per rank
//!   plus a manifest, readable at any world size, stage and tensor-parallel size).
//! - A run started from another tool's model file ([`init`], `--init-from`) and `zero-train
//!   export` ([`export`]).
//!
//! Dimension legend: L layers, NH heads, C channels, maxT context length, V vocabulary,
//! Vp vocabulary padded (to a multiple of 128 in llm.c) for fast matrix products.
//!
//! ```
//! use zero_train::checkpoint::{LlmcCheckpoint, ModelShape};
//!
//! let shape = ModelShape { max_t: 8, vocab: 10, padded_vocab: 128, layers: 2, heads: 2, channels: 4 };
//! let ckpt = LlmcCheckpoint::zeros(shape)?;
//! let bytes = ckpt.to_bytes();
//! assert_eq!(LlmcCheckpoint::from_bytes(&bytes)?, ckpt);
//! let units = ckpt.to_units()?;
//! assert_eq!(units.len(), 2 + 2); // embeddings, one per layer, final LayerNorm
//! # Ok::<(), zero_train::checkpoint::CheckpointError>(())
//! ```

mod error;
pub mod export;
mod hf;
mod hf_export;
mod hf_import;
mod hf_sharded;
mod hf_sharded_export;
pub mod init;
mod layout;
mod llmc;
mod llmc_stream;
mod model_file;
pub mod resume;
mod safetensors;
mod tp_map;
pub(crate) mod tp_units;

pub use error::{CheckpointError, LlmcFormatError, Result, SafetensorsError};
pub use hf::hf_config_json;
pub use hf_export::{export_safetensors, write_hf_config, SafetensorsDtype};
pub use hf_import::{read_safetensors, read_safetensors_bytes, safetensors_config};
pub use hf_sharded::{
    parse_hf_index, read_sharded_safetensors, sharded_safetensors_config, HF_INDEX_FILE,
};
pub use hf_sharded_export::{export_sharded_safetensors, shard_name, HF_SINGLE_FILE};
pub use layout::{LlmcTensor, ModelShape};
pub use llmc::{LlmcCheckpoint, LLMC_HEADER_BYTES, LLMC_MAGIC, LLMC_VERSION};
pub use llmc_stream::LlmcStreamWriter;
pub use model_file::{locate_model_file, model_file_config, read_model_file, ModelFileFormat};
