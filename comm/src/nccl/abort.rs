//! Aborting a communicator, the one way every path does it (`Handle::abort`, its `Drop`, a
//! failed init or split); destroying one settles the same way.
//!
//! A non-blocking communicator may answer any call with `ncclInProgress`, and NCCL's rule is
//! then to poll `ncclCommGetAsyncError` until the state leaves `ncclInProgress` before the
//! next call. So an abort is:
//! 1. `ncclCommAbort(raw)`; `ncclSuccess` is done, another error code is a failed abort;
//! 2. on `ncclInProgress`, poll the state until it is anything else, for at most
//!    [`ABORT_WAIT`]; past that the abort is reported as unfinished (the handle is then
//!    leaked: it may still be in use by NCCL's own threads);
//! 3. a failed or unfinished abort is logged here, because its callers abort on an error path
//!    and return the error that led to the abort, and also returned.
//!
//! Whether the installed NCCL's abort ever answers `ncclInProgress` has not been seen: not
//! run on a GPU.

use std::time::{Duration, Instant};

use cudarc::nccl::sys;

use super::ffi::nccl_error;
use crate::error::{CommError, Result};

/// How long an abort in progress is polled before it is reported as unfinished (step 2).
pub(crate) const ABORT_WAIT: Duration = Duration::from_secs(5);

/// Aborts `raw` by steps 1 to 3; a null `raw` (a communicator never created) is a no-op.
///
/// # Safety
/// S1, S2: `raw` is null or a live communicator that no other thread uses and that is not
/// used after this call.
pub(crate) unsafe fn abort_raw(raw: sys::ncclComm_t) -> Result<()> {
    if raw.is_null() {
        return Ok(());
    }
    // SAFETY: S1, S2 per this function's contract.
    let first = unsafe { sys::ncclCommAbort(raw) };
    // SAFETY: as above; `first` is this abort's return.
    unsafe { settle_logged(raw, "ncclCommAbort", first) }
}

/// Destroys a finalized `raw` (`ncclCommDestroy`), settled and logged as an abort is.
///
/// # Safety
/// As [`abort_raw`], and `raw` is not null.
pub(crate) unsafe fn destroy_raw(raw: sys::ncclComm_t) -> Result<()> {
    // SAFETY: S1, S2 per this function's contract.
    let first = unsafe { sys::ncclCommDestroy(raw) };
    // SAFETY: as above; `first` is this destroy's return.
    unsafe { settle_logged(raw, "ncclCommDestroy", first) }
}

/// Steps 2 and 3 for `call` on `raw`, which answered `first`.
///
/// # Safety
/// S1, S2: `raw` is the communicator `call` was just made on, by this thread.
unsafe fn settle_logged(
    raw: sys::ncclComm_t,
    call: &'static str,
    first: sys::ncclResult_t,
) -> Result<()> {
    let state = || {
        let mut state = sys::ncclResult_t::ncclSuccess;
        // SAFETY: S1: after `ncclInProgress` the handle stays valid until its state leaves
        // it (NCCL's non-blocking contract), and `settle` stops polling then; S2; `state` is
        // a live local.
        let rc = unsafe { sys::ncclCommGetAsyncError(raw, &mut state) };
        if rc == sys::ncclResult_t::ncclSuccess {
            state
        } else {
            rc
        }
    };
    let result = settle(call, first, state, ABORT_WAIT);
    if let Err(e) = &result {
        tracing::error!(
            error = %e,
            "NCCL communicator not released; its resources may stay allocated and its peers \
             may wait for it"
        );
    }
    result
}

/// Steps 1 and 2 on `first` (the return of `call`, an abort or a destroy) and `state` (the communicator's state,
/// polled), apart from NCCL so they are tested on the host.
pub(crate) fn settle(
    call: &'static str,
    first: sys::ncclResult_t,
    mut state: impl FnMut() -> sys::ncclResult_t,
    limit: Duration,
) -> Result<()> {
    use sys::ncclResult_t::{ncclInProgress, ncclSuccess};
    match first {
        ncclSuccess => return Ok(()),
        ncclInProgress => {}
        code => return Err(nccl_error(call, code)),
    }
    let start = Instant::now();
    loop {
        match state() {
            ncclSuccess => return Ok(()),
            ncclInProgress if start.elapsed() < limit => {
                std::thread::sleep(Duration::from_millis(1));
            }
            ncclInProgress => {
                return Err(CommError::Vendor {
                    backend: "nccl",
                    call,
                    name: format!(
                        "still ncclInProgress after {:?}: the call did not finish",
                        start.elapsed()
                    ),
                    code: i64::from(ncclInProgress as u32),
                })
            }
            code => return Err(nccl_error(call, code)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sys::ncclResult_t::{ncclInProgress, ncclInternalError, ncclSuccess, ncclSystemError};

    #[test]
    fn an_abort_that_succeeds_at_once_polls_nothing() {
        let polled = settle(
            "ncclCommAbort",
            ncclSuccess,
            || panic!("polled"),
            ABORT_WAIT,
        );
        assert!(polled.is_ok());
    }

    #[test]
    fn an_abort_in_progress_is_polled_until_it_settles() {
        let mut states = [ncclInProgress, ncclInProgress, ncclSuccess].into_iter();
        assert!(settle(
            "ncclCommAbort",
            ncclInProgress,
            || states.next().unwrap(),
            ABORT_WAIT
        )
        .is_ok());
        assert_eq!(states.next(), None);
    }

    #[test]
    fn an_abort_that_stays_in_progress_is_reported_unfinished() {
        let err = settle(
            "ncclCommAbort",
            ncclInProgress,
            || ncclInProgress,
            Duration::from_millis(20),
        );
        let err = err.unwrap_err().to_string();
        assert!(
            err.contains("ncclCommAbort") && err.contains("did not finish"),
            "{err}"
        );
    }

    #[test]
    fn a_failed_abort_is_an_error_naming_the_code() {
        let err = settle(
            "ncclCommAbort",
            ncclInternalError,
            || ncclSuccess,
            ABORT_WAIT,
        )
        .unwrap_err();
        assert!(err.to_string().contains("ncclInternalError"), "{err}");
        let mut states = [ncclInProgress, ncclSystemError].into_iter();
        let err = settle(
            "ncclCommAbort",
            ncclInProgress,
            || states.next().unwrap(),
            ABORT_WAIT,
        )
        .unwrap_err();
        assert!(err.to_string().contains("ncclSystemError"), "{err}");
    }
}
