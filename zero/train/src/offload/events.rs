//! What the offloader did, recorded on request so tests can check the order of copies.

use std::sync::{Arc, Mutex};

/// What the offloader did, in order (main-thread side), when asked to record it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffloadEvent {
    /// Segment s's copy to host was queued.
    KeepQueued(usize),
    /// Segment s's fetch back into a slot was queued.
    FetchQueued(usize),
    /// Segment s was restored into the model's input; `fetched_ahead`: its fetch had been
    /// queued before `restore` was called.
    Restored {
        /// The segment.
        segment: usize,
        /// The fetch was queued before the call.
        fetched_ahead: bool,
    },
}

/// A record of [`OffloadEvent`]s shared with the caller.
pub type EventLog = Arc<Mutex<Vec<OffloadEvent>>>;
