//! A reusable barrier with timeouts, breaking and departures: the only blocking primitive of
//! the local backend.
//!
//! Two kinds of wait. An *entry* wait (ranks arriving at a collective) may time out or see
//! the group broken; it decides under the mutex, so either every rank passes a generation or
//! none does, and no rank ever reads the buffer of a peer that gave up. A *committed* wait
//! (between phases of a collective every rank has entered) never times out: every rank in it
//! runs copy loops that cannot block, so it arrives; only a rank that is gone (its
//! communicator dropped mid-operation, an internal bug) ends the wait with an error.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::error::BreakCause;

/// How a rank waits.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Wait {
    /// Arriving at the collective with sequence number `seq`; give up after `timeout`.
    Entry { timeout: Duration, seq: u64 },
    /// Between phases of a collective all ranks entered.
    Committed,
}

/// Why a wait failed.
#[derive(Debug)]
pub(crate) enum BarrierError {
    Timeout {
        missing: Vec<usize>,
        waited: Duration,
    },
    Broken(BreakCause),
}

#[derive(Debug)]
struct State {
    generation: u64,
    arrived: Vec<bool>,
    count: usize,
    broken: Option<BreakCause>,
    gone: Vec<bool>,
}

/// The barrier of one group.
#[derive(Debug)]
pub(crate) struct Barrier {
    size: usize,
    state: Mutex<State>,
    cv: Condvar,
    /// Mirrors `state.generation` so waiters can spin without the lock.
    generation: AtomicU64,
    /// Mirrors `state.broken.is_some()`.
    broken: AtomicBool,
}

/// Spin iterations before yielding, and yields before sleeping on the condvar. Short: on two
/// cores with eight ranks, spinning steals the time slices the late ranks need.
const SPINS: u32 = 2_000;
const YIELDS: u32 = 50;
/// Longest sleep between checks of the clock.
const SLICE: Duration = Duration::from_millis(50);

impl Barrier {
    pub fn new(size: usize) -> Self {
        Barrier {
            size,
            state: Mutex::new(State {
                generation: 0,
                arrived: vec![false; size],
                count: 0,
                broken: None,
                gone: vec![false; size],
            }),
            cv: Condvar::new(),
            generation: AtomicU64::new(0),
            broken: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is a handful of counters updated atomically under the lock; a panic
        // elsewhere cannot leave it half-written, so a poisoned lock is still consistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Arrives for `rank` and waits for the others.
    pub fn wait(&self, rank: usize, how: Wait) -> Result<(), BarrierError> {
        let start = Instant::now();
        let mut st = self.lock();
        if let (Wait::Entry { .. }, Some(cause)) = (how, &st.broken) {
            return Err(BarrierError::Broken(cause.clone()));
        }
        st.arrived[rank] = true;
        st.count += 1;
        if st.count == self.size {
            st.generation += 1;
            st.count = 0;
            st.arrived.iter_mut().for_each(|a| *a = false);
            self.generation.store(st.generation, Ordering::Release);
            drop(st);
            self.cv.notify_all();
            return Ok(());
        }
        let mine = st.generation;
        drop(st);

        for i in 0..SPINS + YIELDS {
            if self.generation.load(Ordering::Acquire) != mine {
                // Synchronise with the last arriver's writes through the lock as well, so
                // what the peers published before arriving is visible.
                drop(self.lock());
                return Ok(());
            }
            if self.broken.load(Ordering::Relaxed) {
                break;
            }
            if i < SPINS {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }

        let mut st = self.lock();
        loop {
            if st.generation != mine {
                return Ok(());
            }
            match how {
                Wait::Entry { timeout, seq } => {
                    if let Some(cause) = st.broken.clone() {
                        retract(&mut st, rank);
                        return Err(BarrierError::Broken(cause));
                    }
                    let waited = start.elapsed();
                    if waited >= timeout {
                        let missing = (0..self.size).filter(|&r| !st.arrived[r]).collect();
                        retract(&mut st, rank);
                        st.broken = Some(BreakCause::TimedOut { rank, seq });
                        self.broken.store(true, Ordering::Relaxed);
                        drop(st);
                        self.cv.notify_all();
                        return Err(BarrierError::Timeout { missing, waited });
                    }
                    let slice = SLICE.min(timeout - waited);
                    st = self
                        .cv
                        .wait_timeout(st, slice)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                }
                Wait::Committed => {
                    let gone = (0..self.size).find(|&r| !st.arrived[r] && st.gone[r]);
                    if let Some(r) = gone {
                        let cause = st.broken.clone().unwrap_or(BreakCause::Left { rank: r });
                        return Err(BarrierError::Broken(cause));
                    }
                    st = self
                        .cv
                        .wait_timeout(st, SLICE)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                }
            }
        }
    }

    /// Breaks the group (first cause wins) without marking anyone gone.
    pub fn break_with(&self, cause: BreakCause) {
        let mut st = self.lock();
        st.broken.get_or_insert(cause);
        self.broken.store(true, Ordering::Relaxed);
        drop(st);
        self.cv.notify_all();
    }

    /// Marks `rank` gone and breaks the group.
    pub fn leave(&self, rank: usize, cause: BreakCause) {
        let mut st = self.lock();
        st.gone[rank] = true;
        st.broken.get_or_insert(cause);
        self.broken.store(true, Ordering::Relaxed);
        drop(st);
        self.cv.notify_all();
    }
}

/// Withdraws an entry arrival that gave up, so the generation can never complete with it.
fn retract(st: &mut State, rank: usize) {
    st.arrived[rank] = false;
    st.count -= 1;
}
