//! Errors of the GPT model.
//!
//! Local to `gpt` for now: the crate-wide `zero::Error` does not exist yet, and when it does this
//! enum becomes one of its variants (`#[from]`), so callers keep the structured fields.

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
}

/// Result alias of the `gpt` module.
pub type Result<T, E = GptError> = std::result::Result<T, E>;
