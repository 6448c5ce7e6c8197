//! Errors of checkpoint reading and writing.

use std::path::PathBuf;

impl From<crate::fsio::IoFailure> for Error {
    fn from(e: crate::fsio::IoFailure) -> Self {
        Self::Io {
            op: e.op,
            path: e.path,
            source: e.source,
        }
    }
}

/// Result alias of the checkpoint module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What is wrong with the bytes of an llm.c checkpoint.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum FormatError {
    /// Fewer bytes than the 1024-byte header.
    #[error("truncated header: {got} bytes, the header is {expected}")]
    TruncatedHeader {
        /// Header size in bytes.
        expected: usize,
        /// Bytes present.
        got: usize,
    },
    /// Not an llm.c float32 model file.
    #[error("wrong magic {found} (expected {expected}): not an llm.c model checkpoint")]
    BadMagic {
        /// The expected magic.
        expected: i32,
        /// The value found.
        found: i32,
    },
    /// A version other than 3 (float32 with padded vocabulary); llm.c's bf16 files are 5.
    #[error("unsupported version {found} (only version {supported}, float32, is supported)")]
    BadVersion {
        /// The supported version.
        supported: i32,
        /// The value found.
        found: i32,
    },
    /// A dimension that is zero or negative.
    #[error("dimension {field} = {value} must be positive")]
    BadDimension {
        /// Which dimension.
        field: &'static str,
        /// Its value.
        value: i64,
    },
    /// Dimensions the model refuses (heads not dividing channels, Vp not a multiple of 128
    /// or below V, ...), in the model's own words.
    #[error("invalid model: {field} = {value}: {reason}")]
    InvalidModel {
        /// The `GptConfig` field.
        field: &'static str,
        /// Its value.
        value: usize,
        /// What it must satisfy.
        reason: &'static str,
    },
    /// The parameter count implied by the header overflows.
    #[error("the header's dimensions imply more parameters than can be addressed")]
    SizeOverflow,
    /// The payload length disagrees with the header.
    #[error("header implies {expected_bytes} parameter bytes but {got_bytes} are present")]
    LengthMismatch {
        /// Bytes the header implies.
        expected_bytes: u64,
        /// Bytes present (for streams, at most one more than expected is read).
        got_bytes: u64,
    },
}

/// Errors of the checkpoint module.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An I/O operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A malformed llm.c checkpoint.
    #[error("llm.c checkpoint {path}: {source}")]
    Format {
        /// The file, or `<memory>` / `<stream>`.
        path: PathBuf,
        /// What is wrong.
        #[source]
        source: FormatError,
    },
    /// Buffers whose sizes do not fit the model shape.
    #[error("{what}: expected {expected} elements, got {got}")]
    ShapeMismatch {
        /// Which buffer.
        what: String,
        /// Elements the shape implies.
        expected: usize,
        /// Elements given.
        got: usize,
    },
    /// A training-state manifest that cannot be used.
    #[error("training state {path}: {reason}")]
    BadState {
        /// The state directory.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A tensor whose stored bytes do not match their checksum.
    #[error("training state {path}: tensor {name} is corrupt (checksum {found:016x}, manifest says {expected:016x})")]
    ChecksumMismatch {
        /// The state directory.
        path: PathBuf,
        /// The tensor.
        name: String,
        /// Checksum in the manifest.
        expected: u64,
        /// Checksum of the bytes read.
        found: u64,
    },
    /// A tensor that is not in the state, or not with the type asked for.
    #[error("training state {path}: tensor {name}: {reason}")]
    Tensor {
        /// The state directory.
        path: PathBuf,
        /// The tensor.
        name: String,
        /// What is wrong (missing, wrong dtype or length, duplicate name).
        reason: String,
    },
    /// The manifest is not valid JSON of the expected shape.
    #[error("training state {path}: manifest: {source}")]
    Json {
        /// The manifest file.
        path: PathBuf,
        /// The parser's error.
        #[source]
        source: serde_json::Error,
    },
}
