//! Errors of the data pipeline.

use std::path::PathBuf;

use crate::error::IoError;

/// Result alias of the data pipeline.
pub type Result<T, E = DataError> = std::result::Result<T, E>;

/// What is wrong with the bytes of a token file (independent of where they came from).
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum TokenFileError {
    /// Fewer bytes than the 1024-byte header.
    #[error("truncated header: {got} bytes, a token file starts with a {expected}-byte header")]
    TruncatedHeader {
        /// Header size in bytes.
        expected: usize,
        /// Bytes present.
        got: usize,
    },
    /// The first header word is not the token-file magic.
    #[error("wrong magic {found} (expected {expected}): not an llm.c token file")]
    BadMagic {
        /// The expected magic number.
        expected: i32,
        /// The value found.
        found: i32,
    },
    /// A version this reader does not understand (llm.c's version 2 holds uint32 tokens).
    #[error("unsupported version {found} (only version {supported}, uint16 tokens, is supported)")]
    BadVersion {
        /// The supported version.
        supported: i32,
        /// The value found.
        found: i32,
    },
    /// The header's token count is negative.
    #[error("negative token count {count} in the header")]
    NegativeCount {
        /// The count in the header.
        count: i32,
    },
    /// The payload length disagrees with the header's token count.
    #[error("header says {header_tokens} tokens ({expected_bytes} payload bytes) but the payload has {payload_bytes} bytes")]
    CountMismatch {
        /// Token count from the header.
        header_tokens: u64,
        /// Payload bytes the header implies.
        expected_bytes: u64,
        /// Payload bytes present (for streams, at most one more than expected is read).
        payload_bytes: u64,
    },
    /// A token id outside the vocabulary.
    #[error(
        "token {token} at index {index} is outside the vocabulary of {vocab} (the model's \
         --vocab; `zero-train prepare` writes GPT-2 token ids, which need --vocab 50257)"
    )]
    TokenOutOfRange {
        /// Position of the token in the file.
        index: usize,
        /// The token id.
        token: u16,
        /// The vocabulary size it was checked against.
        vocab: u32,
    },
    /// More tokens than the format's int32 count can describe.
    #[error("{count} tokens do not fit the format's int32 count")]
    TooManyTokens {
        /// Number of tokens offered.
        count: usize,
    },
}

/// Errors of the data pipeline: reading, writing and preparing token files, loading batches.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// An I/O operation on a file failed (missing file, permission, disk full...).
    #[error(transparent)]
    Io(#[from] IoError),
    /// A token file is malformed.
    #[error("token file {path}: {source}")]
    Format {
        /// The file, or `<memory>` / `<stream>` for in-memory parsing.
        path: PathBuf,
        /// What is wrong.
        #[source]
        source: TokenFileError,
    },
    /// A text file is not UTF-8.
    #[error("text file {path} is not valid UTF-8 (at byte {valid_up_to})")]
    NotUtf8 {
        /// The file.
        path: PathBuf,
        /// Length of its valid UTF-8 prefix.
        valid_up_to: usize,
    },
    /// The GPT-2 tokenizer could not be built.
    #[error("GPT-2 tokenizer: {0}")]
    Tokenizer(String),
    /// `prepare` was given nothing to do or a bad split.
    #[error("prepare: {reason}")]
    InvalidPrepare {
        /// What is wrong.
        reason: String,
    },
    /// A loader configuration that cannot work (zero sizes, rank out of range, overflow).
    #[error("data loader: invalid configuration: {reason}")]
    InvalidConfig {
        /// What is wrong.
        reason: String,
    },
    /// The token file is too small for even one global batch.
    #[error("data loader: one global batch needs {needed} tokens but the file has {available}")]
    NotEnoughTokens {
        /// Tokens one global batch needs (`B * T * world * accum + 1`).
        needed: u64,
        /// Tokens in the file.
        available: u64,
    },
    /// Output buffers of the wrong length.
    #[error("data loader: output buffers hold {got} tokens, expected B*T = {expected}")]
    BufferSize {
        /// B * T.
        expected: usize,
        /// Length given.
        got: usize,
    },
    /// A saved loader state that does not belong to this loader.
    #[error("data loader: cannot restore state: {reason}")]
    StateMismatch {
        /// What differs.
        reason: String,
    },
}
