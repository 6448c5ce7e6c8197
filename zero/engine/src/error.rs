//! The one error type of crate `zero`: the engine, its partitions and its optimizer.

use super::planning::policy::ZeroStage;

/// What can go wrong in the ZeRO engine, its partitioning or its optimizer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The rank's arena refused an allocation or a view.
    #[error("memory: {0}")]
    Alloc(#[from] zero_alloc::AllocError),
    /// A collective failed (timeout, dead peer, mismatch).
    #[error("communication: {0}")]
    Comm(#[from] zero_comm::CommError),
    /// A partition needs at least one rank.
    #[error("cannot partition across a world of 0 ranks")]
    ZeroWorld,
    /// Shards must be a multiple of a positive number of elements.
    #[error("shard alignment must be at least one element")]
    ZeroAlign,
    /// A unit's padded size does not fit in `usize`.
    #[error("padding {numel} elements to a multiple of {world} x {align} overflows")]
    PartitionOverflow {
        /// Elements in the unit.
        numel: usize,
        /// Ranks.
        world: usize,
        /// Alignment in elements.
        align: usize,
    },
    /// The configuration needs more memory than the cap allows.
    #[error(
        "{stage} needs {needed} bytes per rank for model states, transient unit buffers and \
         activations, but --memory-limit is {limit} bytes; {hint}"
    )]
    DoesNotFit {
        /// The stage asked for.
        stage: ZeroStage,
        /// Bytes it needs per rank.
        needed: u64,
        /// The cap.
        limit: u64,
        /// Which stage would fit, or how many bytes the smallest stage needs.
        hint: String,
    },
    /// The offloaded tiers' host memory needs more than `--host-memory-limit`.
    #[error(
        "--host-memory-limit is {limit} bytes, but the offloaded tiers' host memory needs \
         {needed} bytes per rank: {parts}"
    )]
    HostDoesNotFit {
        /// Bytes the host arenas need together.
        needed: u64,
        /// The cap.
        limit: u64,
        /// What makes up `needed`, part by part.
        parts: String,
    },
    /// A unit's parameters were used while not gathered (stage 3).
    #[error("unit {unit} is used without being gathered first (call gather before use)")]
    NotGathered {
        /// The unit.
        unit: usize,
    },
    /// A unit index past the registered units.
    #[error("unit {unit} does not exist: the engine has {units} units")]
    NoSuchUnit {
        /// The index given.
        unit: usize,
        /// Units registered.
        units: usize,
    },
    /// A storage kernel was given an element type no [`crate::Precision`] stores (i32, i64,
    /// f64: types zero-comm moves for the engine's own exchanges).
    #[error("{dtype} is not a type model states are stored in (float, bfloat16, half)")]
    NotStored {
        /// The element type given.
        dtype: zero_comm::DType,
    },
    /// A kernel was given a range outside its block, or ranges of different lengths.
    #[error("kernel {kernel}: {message}")]
    BadSpan {
        /// The kernel.
        kernel: &'static str,
        /// What does not fit.
        message: String,
    },
    /// A device kernels implementation cannot run: a missing CUDA library, an arena on
    /// another device, or a failed driver or NVRTC call.
    #[error("device kernels, {op}: {message}")]
    Device {
        /// The operation that failed.
        op: &'static str,
        /// Why.
        message: String,
    },
    /// A call out of the order forward -> backward -> step.
    #[error("{0}")]
    Order(String),
    /// A configuration the engine cannot run, and why.
    #[error("{0}")]
    Config(String),
    /// A unit specification is inconsistent.
    #[error("unit {unit}: {message}")]
    BadUnit {
        /// The unit.
        unit: usize,
        /// What is wrong.
        message: String,
    },
    /// The gradients hold an inf or NaN (fp32 training has no loss scale to skip with).
    #[error("gradient norm is {norm} at step {step}: the gradients hold an inf or NaN")]
    NonFinite {
        /// The optimizer step that would have been taken.
        step: u64,
        /// The norm found.
        norm: f64,
    },
    /// AdamW's parameter, gradient and moment slices differ in length.
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
    /// AdamW's decay segments overlap or are out of order.
    #[error("AdamW: decay segment {index} ({start}..{end}) overlaps or precedes the previous one")]
    SegmentsUnordered {
        /// Index of the offending segment.
        index: usize,
        /// Its start.
        start: usize,
        /// Its end.
        end: usize,
    },
    /// Optimizer steps count from 1 (bias correction divides by `1 - beta^t`).
    #[error("AdamW: step must be at least 1, got 0")]
    StepZero,
    /// An optimizer or schedule hyper-parameter outside its domain.
    #[error("{what}: {value} is out of range ({expected})")]
    BadHyperParameter {
        /// Which setting.
        what: &'static str,
        /// Its value.
        value: f64,
        /// The allowed range.
        expected: &'static str,
    },
    /// The model borrows more arena bytes than it declared for its activations.
    #[error(
        "the model borrows {lent} bytes for good but declared {declared} \
         (EngineConfig::activation_bytes): the memory plan reserves only what is declared"
    )]
    Undeclared {
        /// Bytes lent, this block included.
        lent: u64,
        /// Bytes declared.
        declared: u64,
    },
    /// A model's program is malformed, differs between ranks, or was not declared.
    #[error("the model's program: {0}")]
    BadProgram(String),
}

/// Result alias of crate `zero`.
pub type Result<T, E = Error> = std::result::Result<T, E>;
