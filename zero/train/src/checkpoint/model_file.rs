//! A model file from another tool: llm.c's `model.bin` (header magic 20240326) or a Hugging
//! Face GPT-2 safetensors file, told apart by their first bytes; HF's sharded form, named by
//! its `model.safetensors.index.json`; or a Hugging Face model folder holding either. Each
//! brings its own shape, so `--init-from` needs no shape flags.

use std::fs::File;
use std::path::{Path, PathBuf};

use zero_gpt::GptConfig;

use super::error::{CheckpointError, Result};
use super::hf_import::{read_safetensors, safetensors_config};
use super::hf_sharded::{read_sharded_safetensors, sharded_safetensors_config, HF_INDEX_FILE};
use super::llmc::{LlmcCheckpoint, LLMC_MAGIC};
use super::safetensors::MAX_HEADER_BYTES;
use crate::fsio::{failed, read_up_to};

/// The formats `--init-from` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelFileFormat {
    /// llm.c's float32 `model.bin`.
    Llmc,
    /// A safetensors file with Hugging Face GPT-2 names.
    Safetensors,
    /// Hugging Face's sharded safetensors: an `*.index.json` file and the shards it names.
    ShardedSafetensors,
}

impl ModelFileFormat {
    /// The format of the file at `path`, from its first bytes: llm.c when its first word is
    /// llm.c's magic; safetensors when a header length the reader accepts is followed by
    /// `{`, or when the file is too short to tell (the reader then names what is missing).
    ///
    /// # Errors
    /// [`CheckpointError::Io`] when the file cannot be opened or read; [`CheckpointError::UnknownModelFile`]
    /// when it starts like neither.
    pub fn detect(path: &Path) -> Result<Self> {
        let mut start = [0u8; 9];
        let mut file = File::open(path).map_err(failed("open", path))?;
        let got = read_up_to(&mut file, &mut start).map_err(failed("read", path))?;
        Self::from_start(&start[..got]).ok_or_else(|| CheckpointError::UnknownModelFile {
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

/// The file `path` names and its format: in a folder, its [`HF_INDEX_FILE`] or else its
/// `model.safetensors`; a file named `*.index.json` is a sharded index; any other file is
/// told by its first bytes.
///
/// # Errors
/// [`CheckpointError::NoModelInFolder`], and as [`ModelFileFormat::detect`].
pub fn locate_model_file(path: &Path) -> Result<(PathBuf, ModelFileFormat)> {
    if path.is_dir() {
        let candidates = [
            (HF_INDEX_FILE, ModelFileFormat::ShardedSafetensors),
            ("model.safetensors", ModelFileFormat::Safetensors),
        ];
        return candidates
            .into_iter()
            .map(|(name, format)| (path.join(name), format))
            .find(|(file, _)| file.is_file())
            .ok_or_else(|| CheckpointError::NoModelInFolder {
                path: path.to_path_buf(),
            });
    }
    let name = path.file_name().map(|n| n.to_string_lossy());
    if name.is_some_and(|n| n.ends_with(".index.json")) {
        return Ok((path.to_path_buf(), ModelFileFormat::ShardedSafetensors));
    }
    Ok((path.to_path_buf(), ModelFileFormat::detect(path)?))
}

/// The model the file at `path` ([`locate_model_file`]) holds, from its headers alone.
/// `n_head` is used for a safetensors file without a `config.json` beside it (llm.c's
/// header has its own).
///
/// # Errors
/// The reader's errors, naming the file (and the tensor where one is at fault).
pub fn model_file_config(path: &Path, n_head: Option<usize>) -> Result<GptConfig> {
    let (file, format) = locate_model_file(path)?;
    match format {
        ModelFileFormat::Llmc => Ok(LlmcCheckpoint::read_shape(&file)?.config()),
        ModelFileFormat::Safetensors => safetensors_config(&file, n_head),
        ModelFileFormat::ShardedSafetensors => sharded_safetensors_config(&file, n_head),
    }
}

/// The model and its parameters in unit layout, from any of the formats.
///
/// # Errors
/// As [`model_file_config`], and for the data: truncated files, wrong lengths.
pub fn read_model_file(path: &Path, n_head: Option<usize>) -> Result<(GptConfig, Vec<Vec<f32>>)> {
    let (file, format) = locate_model_file(path)?;
    match format {
        ModelFileFormat::Llmc => {
            let ckpt = LlmcCheckpoint::load(&file)?;
            Ok((ckpt.shape().config(), ckpt.to_units()?))
        }
        ModelFileFormat::Safetensors => read_safetensors(&file, n_head),
        ModelFileFormat::ShardedSafetensors => read_sharded_safetensors(&file, n_head),
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
