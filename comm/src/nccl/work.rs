//! A launched group of collectives: completes when the event recorded after it does.

use std::rc::Rc;
use std::time::Instant;

use cudarc::driver::{CudaEvent, CudaStream};

use super::ffi::driver_error;
use super::handle::{poll_until, Handle, Stop};
use crate::error::Result;
use crate::op::OpDesc;

/// The pending result of [`Group::launch`](super::Group::launch).
///
/// Dropping it does not wait: the collectives still complete in stream order (soundness
/// argument S4 in the module docs), but failures and timeouts are then seen only by the next
/// wait on this communicator.
#[must_use = "a collective's failure or timeout is only seen by waiting"]
#[derive(Debug)]
pub struct NcclWork {
    pub(crate) event: CudaEvent,
    /// The group's first collective: named by a timeout.
    pub(crate) desc: OpDesc,
    pub(crate) deadline: Instant,
    pub(crate) handle: Rc<Handle>,
}

impl NcclWork {
    /// Makes `consumer` wait (on the device, not the host) for these collectives.
    ///
    /// # Errors
    /// [`CommError::Vendor`](crate::CommError::Vendor) when CUDA refuses the wait.
    pub fn then(&self, consumer: &CudaStream) -> Result<()> {
        consumer
            .wait(&self.event)
            .map_err(driver_error("cuStreamWaitEvent"))
    }

    /// When the group's timeout runs out: past it, a [`wait`](NcclWork::wait) on unfinished
    /// collectives polls once and reports the timeout (aborting the communicator), so a caller
    /// that only polls with [`is_done`](NcclWork::is_done) can still bound a hang.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// True when the collectives finished; never blocks.
    ///
    /// # Errors
    /// As [`NcclWork::wait`], except that a timeout is only reported by `wait`.
    pub fn is_done(&self) -> Result<bool> {
        let raw = self.handle.raw(&self.desc)?;
        let event = &self.event;
        let complete = || {
            event
                .try_is_complete()
                .map_err(driver_error("cuEventQuery"))
        };
        // A deadline already reached: one poll of NCCL's state and of the event.
        // SAFETY: S1 (`raw` is live: `Handle::raw` checked it), S2.
        match unsafe { poll_until(raw, Instant::now(), complete) } {
            Ok(()) => Ok(true),
            Err(Stop::TimedOut(_)) => Ok(false),
            Err(stop) => Err(self.handle.fail(&self.desc, stop)),
        }
    }

    /// Blocks until the collectives finished, polling NCCL for asynchronous errors.
    ///
    /// # Errors
    /// [`CommError::Timeout`](crate::CommError::Timeout) naming the group's first collective
    /// and its sequence number when it did not finish within the group's timeout (the
    /// communicator is then aborted); [`CommError::Broken`](crate::CommError::Broken) when NCCL
    /// reported an asynchronous error or the communicator was aborted earlier.
    pub fn wait(self) -> Result<()> {
        let event = &self.event;
        self.handle.wait(&self.desc, self.deadline, || {
            event
                .try_is_complete()
                .map_err(driver_error("cuEventQuery"))
        })
    }
}
