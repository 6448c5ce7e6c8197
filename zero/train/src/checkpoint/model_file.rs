//! A model file from another tool, told apart by its first bytes: llm.c's `model.bin`
//! (header magic 20240326) or a Hugging Face GPT-2 safetensors file. Either brings its own
//! shape, so `--init-from` needs no shape flags.

use std::fs::File;
use std::path::Path;

use zero_gpt::GptConfig;

use super::error::{Error, Result};
use super::hf_import::{read_safetensors, safetensors_config};
use super::llmc::{LlmcCheckpoint, LLMC_MAGIC};
use crate::error::IoError;

/// The formats `--init-from` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelFileFormat {
    /// llm.c's float32 `model.bin`.
    Llmc,
    /// A safetensors file with Hugging Face GPT-2 names.
    Safetensors,
}

impl ModelFileFormat {
    /// The format of the file at `path`: llm.c when its first word is llm.c's magic, else
    /// safetensors (whose reader then checks the header).
    ///
    /// # Errors
    /// [`Error::Io`] when the file cannot be opened or read.
    pub fn detect(path: &Path) -> Result<Self> {
        let io = |op| {
            move |source| {
                Error::Io(IoError {
                    op,
                    path: path.to_path_buf(),
                    source,
                })
            }
        };
        let mut word = [0u8; 4];
        let mut file = File::open(path).map_err(io("open"))?;
        let got = crate::fsio::read_up_to(&mut file, &mut word).map_err(io("read"))?;
        let is_llmc = got == 4 && i32::from_le_bytes(word) == LLMC_MAGIC;
        Ok(if is_llmc {
            Self::Llmc
        } else {
            Self::Safetensors
        })
    }
}

/// The model the file at `path` holds, from its header alone. `n_head` is used for a
/// safetensors file without a `config.json` beside it (llm.c's header has its own).
///
/// # Errors
/// The reader's errors, naming the file (and the tensor where one is at fault).
pub fn model_file_config(path: &Path, n_head: Option<usize>) -> Result<GptConfig> {
    match ModelFileFormat::detect(path)? {
        ModelFileFormat::Llmc => Ok(LlmcCheckpoint::read_shape(path)?.config()),
        ModelFileFormat::Safetensors => safetensors_config(path, n_head),
    }
}

/// The model and its parameters in unit layout, from either format.
///
/// # Errors
/// As [`model_file_config`], and for the data: truncated files, wrong lengths.
pub fn read_model_file(path: &Path, n_head: Option<usize>) -> Result<(GptConfig, Vec<Vec<f32>>)> {
    match ModelFileFormat::detect(path)? {
        ModelFileFormat::Llmc => {
            let ckpt = LlmcCheckpoint::load(path)?;
            Ok((ckpt.shape().config(), ckpt.to_units()?))
        }
        ModelFileFormat::Safetensors => read_safetensors(path, n_head),
    }
}
