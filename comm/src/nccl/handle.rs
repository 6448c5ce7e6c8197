//! The raw NCCL communicator, its failure state, and the one polling loop every wait uses.

use std::cell::{Cell, RefCell};
use std::time::{Duration, Instant};

use cudarc::nccl::sys;

use super::abort::{abort_raw, destroy_raw};
use super::ffi;
use crate::config::Config;
use crate::error::{BreakCause, CommError, Result};
use crate::op::{OpDesc, OpKind};
use crate::record::Recorder;
use crate::reduce_op::ReduceOp;
use crate::DType;

/// Why polling stopped without success.
#[derive(Debug)]
pub(crate) enum Stop {
    /// `ncclCommGetAsyncError` reported this code.
    Failed(sys::ncclResult_t),
    /// The deadline passed after waiting this long.
    TimedOut(Duration),
    /// The `done` test failed (a CUDA error on the event).
    Other(CommError),
}

/// Polls `raw` until it is not in progress and `done()` holds, or until `deadline`.
///
/// # Safety
/// `raw` must be a live communicator used by no other thread meanwhile (S1, S2).
pub(crate) unsafe fn poll_until(
    raw: sys::ncclComm_t,
    deadline: Instant,
    mut done: impl FnMut() -> Result<bool>,
) -> std::result::Result<(), Stop> {
    let start = Instant::now();
    let mut polls: u32 = 0;
    loop {
        let mut state = sys::ncclResult_t::ncclSuccess;
        // SAFETY: S1, S2 per this function's contract; `state` is a live local.
        let rc = unsafe { sys::ncclCommGetAsyncError(raw, &mut state) };
        if rc != sys::ncclResult_t::ncclSuccess {
            return Err(Stop::Failed(rc));
        }
        match state {
            sys::ncclResult_t::ncclSuccess => {
                if done().map_err(Stop::Other)? {
                    return Ok(());
                }
            }
            sys::ncclResult_t::ncclInProgress => {}
            failed => return Err(Stop::Failed(failed)),
        }
        let waited = start.elapsed();
        if Instant::now() >= deadline {
            return Err(Stop::TimedOut(waited));
        }
        // Spin briefly for small collectives, then sleep so ranks sharing cores progress.
        polls = polls.saturating_add(1);
        if polls < 1_000 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

/// One rank's NCCL communicator and what it remembers.
#[derive(Debug)]
pub(crate) struct Handle {
    raw: Cell<sys::ncclComm_t>,
    poison: RefCell<Option<BreakCause>>,
    seq: Cell<u64>,
    pub rank: usize,
    pub size: usize,
    pub config: Config,
    pub recorder: RefCell<Recorder>,
}

impl Handle {
    /// Takes ownership of a live, settled communicator.
    pub(crate) fn new(raw: sys::ncclComm_t, rank: usize, size: usize, config: Config) -> Self {
        Handle {
            raw: Cell::new(raw),
            poison: RefCell::new(None),
            seq: Cell::new(0),
            rank,
            size,
            config,
            recorder: RefCell::new(Recorder::new(rank, config.history_len)),
        }
    }

    /// The next descriptor (sequence numbers count every operation, as in the other backends).
    pub(crate) fn next_desc(
        &self,
        kind: OpKind,
        dtype: Option<DType>,
        count: usize,
        root: Option<usize>,
        op: Option<ReduceOp>,
    ) -> OpDesc {
        let seq = self.seq.get();
        self.seq.set(seq + 1);
        OpDesc {
            seq,
            kind,
            dtype,
            count,
            root,
            op,
        }
    }

    /// Adds a finished (or failed) launch to the counters and history; `elapsed` is the time
    /// to enqueue, since completion happens on the device.
    pub(crate) fn record(&self, desc: &OpDesc, started: Instant, ok: bool) {
        let elapsed = started.elapsed();
        self.recorder
            .borrow_mut()
            .record(desc, self.size, elapsed, ok);
    }

    /// The live communicator, or [`CommError::Broken`] after an abort.
    pub(crate) fn raw(&self, desc: &OpDesc) -> Result<sys::ncclComm_t> {
        match &*self.poison.borrow() {
            None => Ok(self.raw.get()),
            Some(cause) => Err(CommError::Broken {
                op: desc.kind,
                seq: desc.seq,
                bytes: desc.bytes(),
                rank: self.rank,
                cause: cause.clone(),
                history: Box::default(),
            }
            .with_history(&self.recorder.borrow().history)),
        }
    }

    /// Aborts the communicator once; later calls report `cause`.
    pub(crate) fn abort(&self, cause: BreakCause) {
        let raw = self.raw.replace(std::ptr::null_mut());
        if self.poison.borrow().is_none() {
            *self.poison.borrow_mut() = Some(cause);
        }
        // SAFETY: S1 (`raw` is null, or was live and is nulled above, so this is its last
        // use), S2. A failed abort is logged there; the caller is reporting `cause`.
        let _logged = unsafe { abort_raw(raw) };
    }

    /// Waits for `done` under the group's timeout; turns a failure into the crate's error
    /// kinds (`Timeout` naming `desc`, or `Broken`), aborting the communicator first.
    pub(crate) fn wait(
        &self,
        desc: &OpDesc,
        deadline: Instant,
        done: impl FnMut() -> Result<bool>,
    ) -> Result<()> {
        let raw = self.raw(desc)?;
        // SAFETY: S1 (`raw` is live: checked just above), S2.
        match unsafe { poll_until(raw, deadline, done) } {
            Ok(()) => Ok(()),
            Err(stop) => Err(self.fail(desc, stop)),
        }
    }

    /// The error for a failed wait on `desc`, after aborting the communicator.
    pub(crate) fn fail(&self, desc: &OpDesc, stop: Stop) -> CommError {
        let history = Box::new(self.recorder.borrow().history.clone());
        let (rank, op, seq, bytes) = (self.rank, desc.kind, desc.seq, desc.bytes());
        match stop {
            Stop::TimedOut(waited) => {
                self.abort(BreakCause::TimedOut { rank, seq });
                // NCCL cannot say which peers are late.
                let missing = Vec::new();
                CommError::Timeout {
                    op,
                    seq,
                    bytes,
                    rank,
                    waited,
                    missing,
                    history,
                }
            }
            Stop::Failed(code) => {
                let what = ffi::nccl_error("ncclCommGetAsyncError", code).to_string();
                let cause = BreakCause::Failed { rank, what };
                self.abort(cause.clone());
                CommError::Broken {
                    op,
                    seq,
                    bytes,
                    rank,
                    cause,
                    history,
                }
            }
            Stop::Other(e) => {
                self.abort(BreakCause::Failed {
                    rank,
                    what: e.to_string(),
                });
                e
            }
        }
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        let raw = self.raw.replace(std::ptr::null_mut());
        if raw.is_null() {
            return;
        }
        let deadline = Instant::now() + self.config.timeout;
        // SAFETY: S1 (live: not aborted, and this is the last owner), S2.
        let finalized = unsafe { ffi::check("ncclCommFinalize", sys::ncclCommFinalize(raw)) }
            .is_ok()
            // SAFETY: as above; finalize flushes outstanding work, bounded by the timeout.
            && unsafe { poll_until(raw, deadline, || Ok(true)) }.is_ok();
        if !finalized {
            // SAFETY: S1: `raw` is not used after this. A failed abort is logged there.
            let _logged = unsafe { abort_raw(raw) };
            return;
        }
        // SAFETY: S1: `raw` is live, finalized and not used after this. A failed destroy is
        // logged there (a drop has nowhere to return it).
        let _logged = unsafe { destroy_raw(raw) };
    }
}
