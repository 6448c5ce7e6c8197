//! Training data: llm.c token files, GPT-2 BPE preparation, and per-rank batch loading.
//!
//! The pipeline is `prepare` (text files to `train.bin` / `val.bin`), then
//! [`TokenFile::open`] on each split, then one [`DataLoader`] per rank that hands out this
//! rank's micro-batches of every global batch.
//!
//! ```
//! use std::sync::Arc;
//! use zero_train::data::{DataLoader, LoaderConfig, TokenFile};
//!
//! let file = Arc::new(TokenFile::from_tokens((0..100).collect())?);
//! let cfg = LoaderConfig { micro_batch: 2, seq_len: 4, rank: 0, world_size: 1, grad_accum_steps: 1, seed: 0, shuffle: false };
//! let mut loader = DataLoader::new(file, cfg)?;
//! let (mut inputs, mut targets) = (vec![0u32; 8], vec![0u32; 8]);
//! loader.next_micro_batch(&mut inputs, &mut targets)?;
//! assert_eq!(&inputs[..4], &[0, 1, 2, 3]);
//! assert_eq!(&targets[..4], &[1, 2, 3, 4]);
//! # Ok::<(), zero_train::data::DataError>(())
//! ```

mod error;
mod loader;
mod prepare;
mod token_file;

pub use error::{DataError, Result, TokenFileError};
pub use loader::{DataLoader, LoaderConfig, LoaderState};
pub use prepare::{prepare, PrepareSummary, TRAIN_FILE, VAL_FILE};
pub use token_file::{
    TokenFile, GPT2_EOT, GPT2_VOCAB, HEADER_BYTES, HEADER_INTS, TOKEN_MAGIC, TOKEN_VERSION,
};
