//! Errors of the optimizer module.

/// Result alias of the optimizer module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Errors of the optimizer module: inconsistent buffers or settings.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum Error {
    /// The parameter, gradient and moment slices differ in length.
    #[error("AdamW: slice lengths differ: params {params}, grads {grads}, m {m}, v {v}")]
    LengthMismatch {
        /// Parameters.
        params: usize,
        /// Gradients.
        grads: usize,
        /// First moments.
        m: usize,
        /// Second moments.
        v: usize,
    },
    /// Decay segments overlap or are out of order.
    #[error("AdamW: decay segment {index} ({start}..{end}) overlaps or precedes the previous one")]
    SegmentsUnordered {
        /// Index of the offending segment.
        index: usize,
        /// Its start.
        start: usize,
        /// Its end.
        end: usize,
    },
    /// Steps count from 1 (bias correction divides by `1 - beta^t`).
    #[error("AdamW: step must be at least 1, got 0")]
    StepZero,
    /// A hyper-parameter outside its domain.
    #[error("{what}: {value} is out of range ({expected})")]
    BadHyperParameter {
        /// Which setting.
        what: &'static str,
        /// Its value.
        value: f64,
        /// The allowed range.
        expected: &'static str,
    },
}
