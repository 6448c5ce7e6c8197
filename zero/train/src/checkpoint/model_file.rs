//! A model file from another tool, told apart by its first bytes: llm.c's `model.bin`
//! (header magic 20240326) or a Hugging Face GPT-2 safetensors file. Either brings its own
//! shape, so `--init-from` needs no shape flags.

use std::fs::File;
use std::path::Path;

use zero_gpt::GptConfig;

use super::error::{Error, Result};
use super::hf_import::{read_safetensors, safetensors_config};
use super::llmc::{LlmcCheckpoint, LLMC_MAGIC};
use super::safetensors::MAX_HEADER_BYTES;
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
    /// The format of the file at `path`, from its first bytes: llm.c when its first word is
    /// llm.c's magic; safetensors when a header length the reader accepts is followed by
    /// `{`, or when the file is too short to tell (the reader then names what is missing).
    ///
    /// # Errors
    /// [`Error::Io`] when the file cannot be opened or read; [`Error::UnknownModelFile`]
    /// when it starts like neither.
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
        let mut start = [0u8; 9];
        let mut file = File::open(path).map_err(io("open"))?;
        let got = crate::fsio::read_up_to(&mut file, &mut start).map_err(io("read"))?;
        Self::from_start(&start[..got]).ok_or_else(|| Error::UnknownModelFile {
            path: path.to_path_buf(),
        })
    }

    /// The format of a file whose first bytes (up to 9) are `start`, if either.
    fn from_start(start: &[u8]) -> Option<Self> {
        let word = |at: usize, n: usize| start.get(at..at + n);
        if word(0, 4).is_some_and(|w| w == LLMC_MAGIC.to_le_bytes()) {
            return Some(Self::Llmc);
        }
        let Some(len_and_brace) = word(0, 9) else {
            return Some(Self::Safetensors);
        };
        let mut len = [0u8; 8];
        len.copy_from_slice(&len_and_brace[..8]);
        let plausible = u64::from_le_bytes(len) <= MAX_HEADER_BYTES && len_and_brace[8] == b'{';
        plausible.then_some(Self::Safetensors)
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

#[cfg(test)]
mod tests {
    use super::ModelFileFormat;

    #[test]
    fn the_first_bytes_tell_the_formats_apart_and_refuse_anything_else() {
        let llmc = 20_240_326_i32.to_le_bytes();
        assert_eq!(
            ModelFileFormat::from_start(&llmc),
            Some(ModelFileFormat::Llmc)
        );
        let mut st = 2_u64.to_le_bytes().to_vec();
        st.push(b'{');
        assert_eq!(
            ModelFileFormat::from_start(&st),
            Some(ModelFileFormat::Safetensors)
        );
        // Too short to tell: the safetensors reader reports the truncation.
        assert_eq!(
            ModelFileFormat::from_start(b"ab"),
            Some(ModelFileFormat::Safetensors)
        );
        assert_eq!(ModelFileFormat::from_start(b"root:x:0:0"), None);
        let mut huge = (100_000_001_u64).to_le_bytes().to_vec();
        huge.push(b'{');
        assert_eq!(ModelFileFormat::from_start(&huge), None);
    }
}
