//! Text to token files with the GPT-2 BPE, in the style of llm.c's `dev/data` scripts.
//!
//! Every source file is one document, and every document is *preceded* by `<|endoftext|>`
//! (50256), as llm.c's preparation scripts do, so the model always sees a document start
//! after the delimiter. Special-token text inside a file is encoded as ordinary text, so a
//! corpus cannot inject delimiters.
//!
//! The validation split is the *first* `val_fraction` of the token stream (llm.c's
//! tinyshakespeare takes its first 32,768 tokens as validation); training gets the rest.
//! Taking it from the start keeps the split stable when more files are appended later.

use std::path::{Path, PathBuf};

use super::error::{DataError, Result};
use super::token_file::{write_atomic, TokenFile, GPT2_EOT};
use crate::fsio::failed;

/// File name of the training split in the output directory.
pub const TRAIN_FILE: &str = "train.bin";
/// File name of the validation split in the output directory.
pub const VAL_FILE: &str = "val.bin";

/// What `prepare` produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrepareSummary {
    /// Number of documents (source files).
    pub documents: usize,
    /// Bytes of text read.
    pub text_bytes: u64,
    /// Tokens in `train.bin`.
    pub train_tokens: usize,
    /// Tokens in `val.bin`.
    pub val_tokens: usize,
    /// Path of `train.bin`.
    pub train_path: PathBuf,
    /// Path of `val.bin`.
    pub val_path: PathBuf,
}

/// Tokenises `texts` (one document each, in the order given) with GPT-2's BPE and writes
/// `train.bin` and `val.bin` into `out_dir` (created if missing).
///
/// `val_fraction` must lie in `(0, 1)`; the validation split is `ceil(val_fraction * n)`
/// tokens taken from the start of the stream, and both splits must be non-empty.
///
/// # Errors
/// [`DataError::InvalidPrepare`] for no inputs or a bad fraction, [`DataError::Io`] naming the file
/// that could not be read or written, [`DataError::NotUtf8`] for a text that is not UTF-8,
/// [`DataError::Tokenizer`] if the BPE tables fail to load.
pub fn prepare(texts: &[PathBuf], out_dir: &Path, val_fraction: f64) -> Result<PrepareSummary> {
    if texts.is_empty() {
        return Err(DataError::InvalidPrepare {
            reason: "no text files given".into(),
        });
    }
    if !(val_fraction > 0.0 && val_fraction < 1.0) {
        return Err(DataError::InvalidPrepare {
            reason: format!("val_fraction must lie strictly between 0 and 1, got {val_fraction}"),
        });
    }
    let bpe = tiktoken_rs::r50k_base().map_err(|e| DataError::Tokenizer(e.to_string()))?;
    let mut stream: Vec<u16> = Vec::new();
    let mut text_bytes = 0u64;
    for path in texts {
        let bytes = std::fs::read(path).map_err(failed("read", path))?;
        text_bytes += bytes.len() as u64;
        let text = std::str::from_utf8(&bytes).map_err(|e| DataError::NotUtf8 {
            path: path.clone(),
            valid_up_to: e.valid_up_to(),
        })?;
        stream.push(GPT2_EOT);
        for id in bpe.encode_ordinary(text) {
            // r50k ids are below 50257; anything else is a tokenizer bug, not user input.
            let id = u16::try_from(id)
                .map_err(|_| DataError::Tokenizer(format!("token id {id} does not fit uint16")))?;
            stream.push(id);
        }
    }
    // ceil so that a tiny corpus still gets a validation token.
    let n = stream.len();
    let val_len = ((n as f64) * val_fraction).ceil() as usize;
    if val_len == 0 || val_len >= n {
        return Err(DataError::InvalidPrepare {
            reason: format!("{n} tokens cannot be split with val_fraction {val_fraction}"),
        });
    }
    let train = TokenFile::from_tokens(stream.split_off(val_len))?;
    let val = TokenFile::from_tokens(stream)?;
    std::fs::create_dir_all(out_dir).map_err(failed("create directory", out_dir))?;
    let train_path = out_dir.join(TRAIN_FILE);
    let val_path = out_dir.join(VAL_FILE);
    write_atomic(&train_path, &train.to_bytes())?;
    write_atomic(&val_path, &val.to_bytes())?;
    tracing::info!(
        documents = texts.len(),
        text_bytes,
        train = train.len(),
        val = val.len(),
        "prepared token files"
    );
    Ok(PrepareSummary {
        documents: texts.len(),
        text_bytes,
        train_tokens: train.len(),
        val_tokens: val.len(),
        train_path,
        val_path,
    })
}
