//! Per-group settings.

use std::time::Duration;

/// Settings shared by every communicator of a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// How long a rank waits for its peers to arrive at a collective before failing with
    /// [`CommError::Timeout`](crate::CommError::Timeout). Default 10 minutes, the field's norm.
    pub timeout: Duration,
    /// How many finished operations each communicator remembers for error messages.
    pub history_len: usize,
    /// Check that every rank issued the same (op, dtype, count, root, redop) at each sequence
    /// number. The local backend always performs this check (its soundness needs the counts to
    /// agree, and it costs N comparisons); backends where it costs a message honour this flag.
    pub debug_checks: bool,
    /// Follow every collective whose result all ranks hold whole (all-reduce, all-gather,
    /// broadcast) with an all-gather of a hash of each rank's result, and fail with
    /// [`CommError::Corrupt`](crate::CommError::Corrupt) naming the ranks that differ.
    /// Off by default: it costs one small collective and one pass over the result per call.
    pub checksums: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            timeout: Duration::from_secs(600),
            history_len: 16,
            debug_checks: false,
            checksums: false,
        }
    }
}

impl Config {
    /// The default settings with another timeout.
    pub fn with_timeout(timeout: Duration) -> Self {
        Config {
            timeout,
            ..Config::default()
        }
    }
}
