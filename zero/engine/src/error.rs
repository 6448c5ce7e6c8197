//! The engine's error type.

use super::memory::ZeroStage;
use super::partition::PartitionError;

/// What can go wrong in the ZeRO engine.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The rank's arena refused an allocation or a view.
    #[error("memory: {0}")]
    Alloc(#[from] zero_alloc::AllocError),
    /// A collective failed (timeout, dead peer, mismatch).
    #[error("communication: {0}")]
    Comm(#[from] zero_comm::CommError),
    /// A unit could not be partitioned.
    #[error(transparent)]
    Partition(#[from] PartitionError),
    /// The configuration needs more memory than the cap allows.
    #[error(
        "{stage} needs {needed} bytes per rank for model states and transient unit buffers, \
         but --memory-limit is {limit} bytes; {hint}"
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
    /// A call out of the order forward -> backward -> step.
    #[error("{0}")]
    Order(String),
    /// A unit specification is inconsistent.
    #[error("unit {unit}: {message}")]
    BadUnit {
        /// The unit.
        unit: usize,
        /// What is wrong.
        message: String,
    },
    /// The ranks do not run the same units in the same order.
    #[error(
        "rank {rank} ran unit {got} at position {position} of the step, but rank {other_rank} ran \
         unit {expected}: every rank must visit units in the same order"
    )]
    DivergentOrder {
        /// This rank.
        rank: usize,
        /// Position in the step's sequence of gathers.
        position: usize,
        /// The unit this rank visited.
        got: usize,
        /// A rank that disagrees.
        other_rank: usize,
        /// What that rank visited.
        expected: usize,
    },
    /// The gradients hold an inf or NaN (fp32 training has no loss scale to skip with).
    #[error("gradient norm is {norm} at step {step}: the gradients hold an inf or NaN")]
    NonFinite {
        /// The optimizer step that would have been taken.
        step: u64,
        /// The norm found.
        norm: f64,
    },
    /// The optimizer refused its inputs.
    #[error(transparent)]
    Optim(#[from] crate::optim::Error),
    /// A rank visits units in another order than on the first step.
    #[error(
        "rank {rank} ran unit {got} at position {position} of this step, but the first step ran \
         unit {recorded} there: the unit order must not change between steps"
    )]
    OrderChanged {
        /// This rank.
        rank: usize,
        /// Position in the step's sequence of unit visits.
        position: usize,
        /// The unit visited now.
        got: usize,
        /// The unit the first step visited (`usize::MAX`: none, the step is longer).
        recorded: usize,
    },
}

/// The engine's result type.
pub type Result<T, E = EngineError> = std::result::Result<T, E>;
