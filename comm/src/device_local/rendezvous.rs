//! The host-side meeting point of the rank threads: a slot table exchanged at a generation
//! barrier, with a timeout on arrival and fail-fast when a rank is gone.
//!
//! Each `exchange` deposits the rank's slot; the last rank to arrive publishes the whole
//! table as one snapshot and opens the next generation. A rank reads the snapshot of its own
//! generation: a faster rank cannot replace it, because the following generation needs the
//! slow rank's arrival, which comes after its read (the mutex orders both).

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::error::BreakCause;
use crate::op::OpDesc;

/// What a rank publishes at one exchange.
#[derive(Debug)]
pub(crate) struct Slot<E> {
    pub desc: OpDesc,
    /// Address of the rank's input (for an in-place call: where its input lies in `recv`).
    pub send: u64,
    /// Address of the rank's output buffer.
    pub recv: u64,
    /// Marks the end of the rank's stream work issued before this exchange; `None` when the
    /// rank synchronised its stream instead (protocol step 6).
    pub event: Option<E>,
}

/// How a rank waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Arriving at a collective: may time out, and refuses a broken group.
    Entry,
    /// Between the phases of a collective every rank entered: never times out (the phases
    /// only enqueue work, which cannot block), ends only when a rank is gone.
    Committed,
}

/// Why an exchange failed.
#[derive(Debug)]
pub(crate) enum ExchangeError {
    Timeout {
        missing: Vec<usize>,
        waited: Duration,
    },
    Broken(BreakCause),
}

type Table<E> = Arc<Vec<Arc<Slot<E>>>>;

#[derive(Debug)]
struct State<E> {
    generation: u64,
    pending: Vec<Option<Arc<Slot<E>>>>,
    count: usize,
    published: Table<E>,
    broken: Option<BreakCause>,
    gone: Vec<bool>,
}

/// The table and barrier one group of rank threads shares.
#[derive(Debug)]
pub(crate) struct Rendezvous<E> {
    size: usize,
    timeout: Duration,
    state: Mutex<State<E>>,
    cv: Condvar,
}

/// Longest sleep between checks of the clock and of departures.
const SLICE: Duration = Duration::from_millis(20);

impl<E> Rendezvous<E> {
    pub fn new(size: usize, timeout: Duration) -> Self {
        Rendezvous {
            size,
            timeout,
            state: Mutex::new(State {
                generation: 0,
                pending: (0..size).map(|_| None).collect(),
                count: 0,
                published: Arc::new(Vec::new()),
                broken: None,
                gone: vec![false; size],
            }),
            cv: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<E>> {
        // Every update under the lock is a few field writes that cannot panic half-way, so a
        // poisoned lock still guards a consistent state.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Deposits `slot` for `rank`, waits for every rank, and returns the table of this
    /// generation (indexed by rank).
    pub fn exchange(
        &self,
        rank: usize,
        slot: Slot<E>,
        phase: Phase,
    ) -> Result<Table<E>, ExchangeError> {
        let (start, seq) = (Instant::now(), slot.desc.seq);
        let mut st = self.lock();
        if let (Phase::Entry, Some(cause)) = (phase, &st.broken) {
            return Err(ExchangeError::Broken(cause.clone()));
        }
        st.pending[rank] = Some(Arc::new(slot));
        st.count += 1;
        if st.count == self.size {
            let table: Vec<Arc<Slot<E>>> = st.pending.iter_mut().filter_map(Option::take).collect();
            st.published = Arc::new(table);
            st.count = 0;
            st.generation += 1;
            let table = Arc::clone(&st.published);
            drop(st);
            self.cv.notify_all();
            return Ok(table);
        }
        let mine = st.generation;
        loop {
            st = self
                .cv
                .wait_timeout(st, SLICE)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
            if st.generation != mine {
                return Ok(Arc::clone(&st.published));
            }
            let arrived = |st: &State<E>, r: usize| st.pending[r].is_some();
            match phase {
                Phase::Entry => {
                    if let Some(cause) = st.broken.clone() {
                        retract(&mut st, rank);
                        return Err(ExchangeError::Broken(cause));
                    }
                    let waited = start.elapsed();
                    if waited >= self.timeout {
                        let missing = (0..self.size).filter(|&r| !arrived(&st, r)).collect();
                        retract(&mut st, rank);
                        st.broken.get_or_insert(BreakCause::TimedOut { rank, seq });
                        drop(st);
                        self.cv.notify_all();
                        return Err(ExchangeError::Timeout { missing, waited });
                    }
                }
                Phase::Committed => {
                    if let Some(r) = (0..self.size).find(|&r| !arrived(&st, r) && st.gone[r]) {
                        let cause = st.broken.clone().unwrap_or(BreakCause::Left { rank: r });
                        return Err(ExchangeError::Broken(cause));
                    }
                }
            }
        }
    }

    /// Breaks the group (the first cause wins) without marking anyone gone.
    pub fn break_with(&self, cause: BreakCause) {
        self.lock().broken.get_or_insert(cause);
        self.cv.notify_all();
    }

    /// Marks `rank` gone and breaks the group.
    pub fn leave(&self, rank: usize, cause: BreakCause) {
        let mut st = self.lock();
        st.gone[rank] = true;
        st.broken.get_or_insert(cause);
        drop(st);
        self.cv.notify_all();
    }
}

/// Withdraws an entry arrival that gave up, so no generation completes with it.
fn retract<E>(st: &mut State<E>, rank: usize) {
    st.pending[rank] = None;
    st.count -= 1;
}
