//! The crate's error type.

use std::time::Duration;

use crate::dtype::DType;
use crate::op::OpKind;
use crate::record::History;

/// Why a group can no longer run collectives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BreakCause {
    /// The rank's thread panicked (its communicator was dropped while unwinding).
    Panicked {
        /// The rank.
        rank: usize,
    },
    /// The rank dropped its communicator (returned early or finished).
    Left {
        /// The rank.
        rank: usize,
    },
    /// A rank gave up waiting for its peers at this sequence number.
    TimedOut {
        /// The rank that timed out.
        rank: usize,
        /// The sequence number.
        seq: u64,
    },
    /// Ranks issued different collectives at this sequence number.
    Mismatch {
        /// The sequence number.
        seq: u64,
    },
    /// The backend reported an asynchronous failure on this rank (NCCL: a network error or
    /// a peer that failed); the communicator was aborted.
    Failed {
        /// The rank that saw it.
        rank: usize,
        /// The backend's description, with its code.
        what: String,
    },
}

impl std::fmt::Display for BreakCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BreakCause::Panicked { rank } => write!(f, "rank {rank} panicked"),
            BreakCause::Left { rank } => write!(f, "rank {rank} dropped its communicator"),
            BreakCause::TimedOut { rank, seq } => write!(f, "rank {rank} timed out at op #{seq}"),
            BreakCause::Mismatch { seq } => write!(f, "ranks issued different ops at #{seq}"),
            BreakCause::Failed { rank, what } => write!(f, "rank {rank} saw {what}"),
        }
    }
}

/// Who was late, for a timeout message; MPI cannot say, and an empty list would read as
/// "nobody".
fn late_ranks(missing: &[usize]) -> String {
    if missing.is_empty() {
        "the backend cannot tell which ranks did not arrive".to_string()
    } else {
        format!("ranks {missing:?} did not arrive")
    }
}

/// Everything that can go wrong in a collective.
#[derive(Debug, thiserror::Error)]
pub enum CommError {
    /// Peers did not arrive in time.
    #[error("{op} #{seq} ({bytes} bytes) timed out after {waited:?} on rank {rank}: {}{history}", late_ranks(.missing))]
    Timeout {
        /// The operation.
        op: OpKind,
        /// Its sequence number.
        seq: u64,
        /// Bytes of the whole array.
        bytes: usize,
        /// The rank reporting.
        rank: usize,
        /// How long it waited.
        waited: Duration,
        /// Ranks that had not arrived.
        missing: Vec<usize>,
        /// This rank's last operations.
        history: Box<History>,
    },
    /// The group failed earlier (a peer died, left, timed out or mismatched).
    #[error(
        "{op} #{seq} ({bytes} bytes) failed on rank {rank}: group is broken: {cause}{history}"
    )]
    Broken {
        /// The operation.
        op: OpKind,
        /// Its sequence number.
        seq: u64,
        /// Bytes of the whole array.
        bytes: usize,
        /// The rank reporting.
        rank: usize,
        /// The first failure in the group.
        cause: BreakCause,
        /// This rank's last operations.
        history: Box<History>,
    },
    /// Ranks called different collectives at the same sequence number.
    #[error("collective mismatch at #{seq}: rank {rank} has {field} = {value} but rank {peer} has {field} = {peer_value}{history}")]
    Mismatch {
        /// Sequence number.
        seq: u64,
        /// The field that differs (`op`, `dtype`, `count`, `root`, `redop`).
        field: &'static str,
        /// The reporting rank.
        rank: usize,
        /// Its value.
        value: String,
        /// The first rank whose value differs.
        peer: usize,
        /// That rank's value.
        peer_value: String,
        /// This rank's last operations.
        history: Box<History>,
    },
    /// A buffer has the wrong length for the call.
    #[error("{op}: {what} has {got} elements, expected {expected}")]
    Length {
        /// The operation.
        op: OpKind,
        /// Which buffer.
        what: &'static str,
        /// Required length.
        expected: usize,
        /// Given length.
        got: usize,
    },
    /// A root outside the group.
    #[error("{op}: root {root} is not a rank of a group of {size}")]
    Root {
        /// The operation.
        op: OpKind,
        /// The root given.
        root: usize,
        /// Group size.
        size: usize,
    },
    /// Send and receive buffers of different element types.
    #[error("{op}: send buffer is {send} but receive buffer is {recv}")]
    DtypeMismatch {
        /// The operation.
        op: OpKind,
        /// Send dtype.
        send: DType,
        /// Receive dtype.
        recv: DType,
    },
    /// A reduction the element type does not have: avg on an integer type (integer sums
    /// wrap, and a mean would need a rounding rule; sum and divide instead).
    #[error("{op}: {redop} is not defined on {dtype} elements (integers have sum, max and min)")]
    UnsupportedReduction {
        /// The operation.
        op: OpKind,
        /// The reduction asked for.
        redop: crate::reduce_op::ReduceOp,
        /// The element type.
        dtype: DType,
    },
    /// A bad argument outside any collective (group size 0, bucket too small, ...).
    #[error("invalid argument: {what}")]
    InvalidArgument {
        /// What is wrong.
        what: String,
    },
    /// The backend cannot do this.
    #[error("backend {backend} does not support {what}")]
    Unsupported {
        /// Backend name.
        backend: &'static str,
        /// What was asked.
        what: String,
    },
    /// The backend cannot run here (its library or device is missing, or it was not built).
    #[error("backend {backend} is not available: {why}")]
    Unavailable {
        /// Backend name.
        backend: &'static str,
        /// What is missing, and what to do about it.
        why: String,
    },
    /// A vendor library call failed; its code is kept.
    #[error("{backend}: {call} failed: {name} (code {code})")]
    Vendor {
        /// Backend name.
        backend: &'static str,
        /// The library function.
        call: &'static str,
        /// The library's name for the code (`ncclSystemError`, `CUDA_ERROR_NO_DEVICE`, ...).
        name: String,
        /// The numeric code.
        code: i64,
    },
    /// A launch variable (`RANK`, `WORLD_SIZE`, ...) is missing, malformed or out of range.
    #[error("environment variable {var} {why}")]
    Launch {
        /// The variable.
        var: &'static str,
        /// What is wrong with it.
        why: String,
    },
    /// The TCP rendezvous that bootstraps a backend failed.
    #[error("rendezvous at {addr}: {what}")]
    Rendezvous {
        /// The address served or contacted.
        addr: String,
        /// What went wrong.
        what: String,
    },
    /// A fault injected on purpose ([`crate::Fault`]) ended this rank's part.
    #[error("injected fault {fault} on rank {rank} at {op} #{seq}")]
    Injected {
        /// The fault's name (`kill`, `hang`).
        fault: &'static str,
        /// The rank it was injected on.
        rank: usize,
        /// The operation.
        op: OpKind,
        /// Its sequence number.
        seq: u64,
    },
    /// Payload checksums ([`crate::Config::checksums`]) show ranks holding different results
    /// of a collective whose result must be the same everywhere.
    #[error("{op} #{seq}: payload checksums differ on rank {rank}: ranks {ranks:?} hold a result unlike the others' (corrupted in flight or in memory){history}")]
    Corrupt {
        /// The operation.
        op: OpKind,
        /// Its sequence number.
        seq: u64,
        /// The rank reporting.
        rank: usize,
        /// The ranks whose result differs from the majority's (every rank without one).
        ranks: Vec<usize>,
        /// This rank's last operations.
        history: Box<History>,
    },
    /// A non-blocking operation was lost: its progress thread died before completing it.
    #[error("{op}: the progress thread of rank {rank} died before completing the operation")]
    ProgressLost {
        /// The operation.
        op: OpKind,
        /// The rank.
        rank: usize,
    },
}

impl CommError {
    /// Attaches `history` to the variants that print one.
    pub(crate) fn with_history(mut self, h: &History) -> Self {
        match &mut self {
            CommError::Timeout { history, .. }
            | CommError::Broken { history, .. }
            | CommError::Mismatch { history, .. }
            | CommError::Corrupt { history, .. } => **history = h.clone(),
            _ => {}
        }
        self
    }
}

/// The crate's result type.
pub type Result<T, E = CommError> = std::result::Result<T, E>;

/// A failed `zero_alloc::context::bind` of `backend`, keeping the driver's code; an error
/// recorded earlier is named as such, not as the call that found it.
#[cfg(feature = "cuda")]
pub(crate) fn bind_error(
    backend: &'static str,
) -> impl Fn(zero_alloc::context::BindError) -> CommError {
    move |e| CommError::Vendor {
        backend,
        call: e.op(),
        name: format!("{:?}", e.driver_error()),
        code: i64::from(e.driver_error().0 as u32),
    }
}
