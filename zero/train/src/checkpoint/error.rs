//! Errors of checkpoint reading and writing.

use std::path::PathBuf;

use crate::error::IoError;

/// Result alias of the checkpoint module.
pub type Result<T, E = CheckpointError> = std::result::Result<T, E>;

/// What is wrong with the bytes of an llm.c checkpoint.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum LlmcFormatError {
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

/// What is wrong with a safetensors file of a GPT-2 (every variant about one tensor names it).
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum SafetensorsError {
    /// Fewer bytes than the 8-byte header length, or than the header it announces.
    #[error("truncated: {what} needs {expected} bytes, the file has {got}")]
    Truncated {
        /// The part cut short.
        what: &'static str,
        /// Bytes it needs.
        expected: u64,
        /// Bytes present.
        got: u64,
    },
    /// A header longer than any GPT-2 needs (the limit of the reference reader).
    #[error("header of {declared} bytes exceeds the limit of {limit}")]
    HeaderTooLarge {
        /// The declared length.
        declared: u64,
        /// The limit.
        limit: u64,
    },
    /// The JSON header does not parse, or is not an object of tensor entries.
    #[error("corrupt header: {reason}")]
    CorruptHeader {
        /// The parser's message.
        reason: String,
    },
    /// A tensor entry without a valid dtype, shape or data_offsets.
    #[error("tensor {tensor}: {reason}")]
    BadEntry {
        /// The tensor.
        tensor: String,
        /// What is wrong.
        reason: String,
    },
    /// A dtype other than F32, BF16 or F16.
    #[error("tensor {tensor}: dtype {dtype} is not supported (F32, BF16 and F16 are)")]
    UnsupportedDtype {
        /// The tensor.
        tensor: String,
        /// Its dtype.
        dtype: String,
    },
    /// Data that lies outside the file, disagrees with the shape, or overlaps another tensor.
    #[error("tensor {tensor}: {reason}")]
    BadExtent {
        /// The tensor.
        tensor: String,
        /// What is wrong.
        reason: String,
    },
    /// A GPT-2 tensor that is not in the file.
    #[error("tensor {tensor} is missing")]
    MissingTensor {
        /// The tensor (HF's name).
        tensor: String,
    },
    /// A tensor that belongs to no GPT-2.
    #[error("tensor {tensor} is not part of a GPT-2 model")]
    UnexpectedTensor {
        /// The tensor.
        tensor: String,
    },
    /// A tensor whose shape disagrees with the model the other tensors describe.
    #[error("tensor {tensor} has shape {got:?}, the model needs {expected:?}")]
    WrongShape {
        /// The tensor.
        tensor: String,
        /// The shape the model needs.
        expected: Vec<usize>,
        /// The shape in the file.
        got: Vec<usize>,
    },
    /// The head count is in no tensor shape: it comes from `config.json` or the caller.
    #[error(
        "the number of heads is not in the tensors: put a config.json with n_head beside the \
         file, or pass it (zero-train: --heads N)"
    )]
    MissingHeads,
    /// A sharded checkpoint's `model.safetensors.index.json` that does not parse, names a
    /// shard outside its folder, or disagrees with the shards' headers.
    #[error("index: {reason}")]
    BadIndex {
        /// What is wrong.
        reason: String,
    },
    /// A `config.json` that does not parse or disagrees with the tensors.
    #[error("config.json: {reason}")]
    BadConfig {
        /// What is wrong.
        reason: String,
    },
    /// Dimensions the model refuses.
    #[error("invalid model: {field} = {value}: {reason}")]
    InvalidModel {
        /// The `GptConfig` field.
        field: &'static str,
        /// Its value.
        value: usize,
        /// What it must satisfy.
        reason: &'static str,
    },
}

/// Errors of the checkpoint module.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// An I/O operation on a file or folder failed.
    #[error(transparent)]
    Io(#[from] IoError),
    /// A malformed llm.c checkpoint.
    #[error("llm.c checkpoint {path}: {source}")]
    Format {
        /// The file, or `<memory>` / `<stream>`.
        path: PathBuf,
        /// What is wrong.
        #[source]
        source: LlmcFormatError,
    },
    /// A malformed safetensors file.
    #[error("safetensors {path}: {source}")]
    Safetensors {
        /// The file, or `<memory>`.
        path: PathBuf,
        /// What is wrong.
        #[source]
        source: SafetensorsError,
    },
    /// A model file that starts like neither format `--init-from` and `export` read.
    #[error(
        "{path}: neither an llm.c model.bin (first word 20240326) nor a safetensors file (an \
         8-byte little-endian header length of at most 100000000, then a JSON object)"
    )]
    UnknownModelFile {
        /// The file.
        path: PathBuf,
    },
    /// A folder given as a model file that holds no Hugging Face model.
    #[error(
        "{path}: a folder without model.safetensors.index.json or model.safetensors (what a \
         Hugging Face model folder holds)"
    )]
    NoModelInFolder {
        /// The folder.
        path: PathBuf,
    },
    /// A sharded export into a folder that already holds a Hugging Face model, whose index or
    /// single file would then disagree with the new shards.
    #[error(
        "{path} already holds a Hugging Face model ({found}): remove it or export to another folder"
    )]
    ModelFolderInUse {
        /// The folder.
        path: PathBuf,
        /// The model file found there.
        found: String,
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
    /// A training state that cannot be saved, read or loaded.
    #[error(transparent)]
    State(#[from] zero_state::StateError),
    /// A safetensors header or a `config.json` that is not valid JSON of the expected
    /// shape, or could not be encoded.
    #[error("{path}: JSON: {source}")]
    Json {
        /// The file.
        path: PathBuf,
        /// The parser's error.
        #[source]
        source: serde_json::Error,
    },
}
