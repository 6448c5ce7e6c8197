//! Errors of the GPT model.
//!
//! zero-gpt's own error enum: its callers (zero-train) wrap it in their own errors and keep
//! the structured fields. The only crate of the project it uses is zero-alloc, for the CUDA
//! library checks and the NVRTC kernel cache; their errors arrive here through `From`.

/// Everything the model can reject: a bad configuration, buffers of the wrong size, token ids
/// out of range, and unit calls made out of order.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum GptError {
    /// A configuration field is out of its valid range.
    #[error("invalid GPT config: {field} = {value}: {reason}")]
    InvalidConfig {
        /// The field's name, as in `GptConfig`.
        field: &'static str,
        /// The rejected value.
        value: usize,
        /// What the field must satisfy.
        reason: &'static str,
    },
    /// `GptConfig::preset` got a name it does not know.
    #[error("unknown GPT preset {name:?} (known: {known})")]
    UnknownPreset {
        /// The name asked for.
        name: String,
        /// The preset names that exist, comma-separated.
        known: &'static str,
    },
    /// A buffer passed to the model has the wrong number of elements.
    #[error("{what}: expected {expected} elements, got {got}")]
    SizeMismatch {
        /// Which buffer.
        what: &'static str,
        /// Elements the size table asks for.
        expected: usize,
        /// Elements received.
        got: usize,
    },
    /// A token or target id is not below the vocabulary size.
    #[error("{what}[{index}] = {id} is out of range for vocab_size {vocab_size}")]
    TokenOutOfRange {
        /// `"tokens"` or `"targets"`.
        what: &'static str,
        /// Position in the flattened (B, T) array.
        index: usize,
        /// The offending id.
        id: u32,
        /// V.
        vocab_size: usize,
    },
    /// The batch shape does not fit the model or the activation buffers.
    #[error("batch shape (B={batch}, T={seq_len}) rejected: {reason}")]
    BadBatch {
        /// B.
        batch: usize,
        /// T.
        seq_len: usize,
        /// Why.
        reason: &'static str,
    },
    /// A layer index past the model's depth.
    #[error("layer {layer} does not exist (num_layers = {num_layers})")]
    NoSuchLayer {
        /// The index asked for.
        layer: usize,
        /// L.
        num_layers: usize,
    },
    /// A per-unit forward or backward call came out of order (forward runs embed, blocks 0..L,
    /// head; backward runs head, blocks L-1..0, embed, each after the matching forward).
    #[error("{call} called out of order: {reason}")]
    OutOfOrder {
        /// The call that was refused.
        call: &'static str,
        /// What had to happen first.
        reason: String,
    },
    /// The kept block inputs (activation checkpointing) failed to keep or restore a segment:
    /// a segment out of range, or the memory behind them (an offload copy thread) failed.
    #[error("kept input of segment {segment}: {reason}")]
    KeptInputs {
        /// The segment asked for.
        segment: usize,
        /// What failed.
        reason: String,
    },
    /// A kernel launch whose shape does not fit CUDA's launch limits or the kernels' 32-bit
    /// dimension arguments.
    #[error("CUDA kernel {kernel}: {what} = {value} exceeds the limit {limit}")]
    LaunchTooLarge {
        /// The kernel's name in its .cu source.
        kernel: &'static str,
        /// Which quantity overflowed (`"grid blocks"`, `"c"`, ...).
        what: &'static str,
        /// The value asked for (`usize::MAX` when computing it overflowed).
        value: usize,
        /// The largest value allowed.
        limit: usize,
    },
    /// The CUDA backend cannot start: a library is missing or the crate was built without
    /// the `cuda` feature.
    #[error("CUDA unavailable: {library}: {reason}")]
    CudaUnavailable {
        /// The missing piece (`"libcuda"`, `"libcublas"`, `"libnvrtc"`, `"cuda feature"`).
        library: &'static str,
        /// Why, and how to provide it.
        reason: String,
    },
    /// A CUDA driver or cuBLAS call failed; the message keeps the vendor's code and text.
    #[error("CUDA {op} failed: {message}")]
    Cuda {
        /// The call that failed.
        op: &'static str,
        /// The vendor error, as its `Debug` prints it.
        message: String,
    },
    /// NVRTC rejected a kernel source.
    #[error("NVRTC could not compile {source_name} for {arch}: {log}")]
    Nvrtc {
        /// The .cu file.
        source_name: &'static str,
        /// The target architecture (`"sm_90"`, or `"default"`).
        arch: &'static str,
        /// The compiler's log.
        log: String,
    },
}

/// Result alias of the `gpt` module.
pub type Result<T, E = GptError> = std::result::Result<T, E>;

impl From<zero_alloc::AllocError> for GptError {
    fn from(e: zero_alloc::AllocError) -> Self {
        use zero_alloc::AllocError;
        match e {
            AllocError::CudaUnavailable { library, reason } => Self::CudaUnavailable {
                library,
                reason: reason.to_string(),
            },
            AllocError::Nvrtc { program, arch, log } => Self::Nvrtc {
                source_name: program,
                arch,
                log,
            },
            AllocError::Cuda { what, message } => Self::Cuda { op: what, message },
            other => Self::Cuda {
                op: "zero-alloc",
                message: other.to_string(),
            },
        }
    }
}
