//! Kept block inputs offloaded to pinned host memory (`--offload-activations`, ZeRO-R's
//! P_a + cpu), copied out and back on a copy thread so the copies overlap compute.
//!
//! Legend: N = B*T positions, C channels, S segments = ceil(L/K).
//!
//! The rank's arena holds only [`STAGING_SLOTS`] slots of one (N,C) input each; host memory
//! holds one pinned (N,C) buffer per segment, owned by the copy thread. The protocol:
//! 1. `keep(s)`: copy the model's input into a free slot and queue "slot -> host s"; forward
//!    goes on while the thread copies (it waits only when both slots are still queued).
//! 2. `due_next(s)`: take a free slot and queue "host s -> slot"; the model gives this hint
//!    when its last segment starts (S-2 is restored first) and right after each restore.
//! 3. `restore(s)`: wait for that fetch (queued one recompute and backward of a segment
//!    earlier), copy the slot into the model's input and free it. A segment never hinted is
//!    fetched there and then.
//!
//! The thread runs jobs in the order queued, so a fetch of s queued after `keep(s)` reads
//! what was kept. Slots move into a job and come back with its completion: safe Rust, no
//! shared memory. A thread that panics drops its end of the channels, so the next call that
//! waits on it gets an error (and every call after it), never a hang. zero_alloc's
//! `CopyEngine` was not used: it copies arena blocks named by handle, and the activations'
//! blocks are lent out of the engine's arena (`Engine::lend_f32`), which hands out no handle.

use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use zero::Engine;
use zero_alloc::PinnedBuffer;
use zero_gpt::{check_kept_call, Buffer, GptError, KeptInputs};

use crate::bridge::StepError;

/// Slots of one (N,C) input the arena holds with offload (fewer when there are fewer
/// segments): one being copied out or in while the model reads or writes the other.
pub const STAGING_SLOTS: usize = 2;

/// Staging slots for `segments` segments.
#[must_use]
pub fn staging_slots(segments: usize) -> usize {
    STAGING_SLOTS.min(segments)
}

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

enum Job {
    ToHost {
        segment: usize,
        slot: Buffer,
    },
    ToSlot {
        segment: usize,
        slot: Buffer,
        fetch: u64,
    },
    #[cfg(test)]
    Panic,
}

struct Done {
    segment: usize,
    slot: Buffer,
    /// The fetch's id, or `None` for a copy to host.
    fetch: Option<u64>,
    result: Result<(), String>,
}

/// [`KeptInputs`] in pinned host memory behind [`STAGING_SLOTS`] arena slots (module docs).
#[derive(Debug)]
pub struct OffloadedInputs {
    jobs: Option<Sender<Job>>,
    done: Receiver<Done>,
    thread: Option<JoinHandle<()>>,
    free: Vec<Buffer>,
    /// Slots holding a fetched segment, oldest first.
    fetched: Vec<(usize, Buffer)>,
    /// Fetches queued and not yet completed: (segment, id).
    fetching: Vec<(usize, u64)>,
    in_flight: usize,
    next_fetch: u64,
    shape: (usize, usize),
    slot_bytes: u64,
    host_bytes: u64,
    failure: Option<String>,
    log: Option<EventLog>,
}

/// Offloaded kept inputs for `segments` inputs of `input_len` (N*C) floats: the slots lent
/// from `engine`'s arena for good, the host buffers pinned.
///
/// # Errors
/// Arena errors (a cap too small), a host allocation or a thread spawn refused.
pub fn offloaded_inputs(
    engine: &mut Engine,
    segments: usize,
    input_len: usize,
) -> Result<OffloadedInputs, StepError> {
    let slots = (0..staging_slots(segments))
        .map(|_| -> Result<Buffer, StepError> { Ok(Box::new(engine.lend_f32(input_len)?)) })
        .collect::<Result<Vec<_>, _>>()?;
    let bytes = input_len.checked_mul(4).ok_or(GptError::KeptInputs {
        segment: 0,
        reason: "input bytes overflow usize".into(),
    })?;
    let hosts = (0..segments)
        .map(|_| PinnedBuffer::new(bytes).map_err(zero::Error::from))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(OffloadedInputs::new(slots, hosts, input_len)?)
}

impl OffloadedInputs {
    /// Offloaded kept inputs staged through `slots` (each `input_len` floats), one host
    /// buffer of `input_len` floats per segment.
    ///
    /// # Errors
    /// [`GptError::SizeMismatch`] for a slot or host buffer of another size or no slot;
    /// [`GptError::KeptInputs`] when the copy thread cannot be started.
    pub fn new(
        slots: Vec<Buffer>,
        hosts: Vec<PinnedBuffer>,
        input_len: usize,
    ) -> Result<Self, GptError> {
        let bad = |what, got| GptError::SizeMismatch {
            what,
            expected: input_len,
            got,
        };
        if let Some(slot) = slots.iter().find(|s| s.floats().len() != input_len) {
            return Err(bad("offload staging slot", slot.floats().len()));
        }
        if let Some(host) = hosts
            .iter()
            .find(|h| h.len() % 4 != 0 || h.len() / 4 != input_len)
        {
            return Err(bad("offload host buffer (floats)", host.len() / 4));
        }
        if slots.is_empty() && !hosts.is_empty() {
            return Err(bad("offload staging slots", 0));
        }
        let (jobs, job_rx) = mpsc::channel();
        let (done_tx, done) = mpsc::channel();
        let segments = hosts.len();
        let thread = std::thread::Builder::new()
            .name("kept-input-copy".into())
            .spawn(move || copy_loop(hosts, &job_rx, &done_tx))
            .map_err(|e| GptError::KeptInputs {
                segment: 0,
                reason: format!("cannot start the copy thread: {e}"),
            })?;
        Ok(Self {
            jobs: Some(jobs),
            done,
            thread: Some(thread),
            slot_bytes: 4 * (slots.len() * input_len) as u64,
            host_bytes: 4 * (segments * input_len) as u64,
            free: slots,
            fetched: Vec::new(),
            fetching: Vec::new(),
            in_flight: 0,
            next_fetch: 0,
            shape: (segments, input_len),
            failure: None,
            log: None,
        })
    }

    /// Records every [`OffloadEvent`] into `log` from now on.
    #[must_use]
    pub fn with_event_log(mut self, log: EventLog) -> Self {
        self.log = Some(log);
        self
    }

    fn record(&self, event: OffloadEvent) {
        if let Some(Ok(mut log)) = self.log.as_ref().map(|l| l.lock()) {
            log.push(event);
        }
    }

    /// Marks the offloader failed: this and every later call return `reason`.
    fn fail(&mut self, segment: usize, reason: String) -> GptError {
        let reason = self.failure.get_or_insert(reason).clone();
        GptError::KeptInputs { segment, reason }
    }

    fn check(&self, segment: usize, len: usize) -> Result<(), GptError> {
        check_kept_call(self.shape, segment, len)?;
        match &self.failure {
            Some(reason) => Err(GptError::KeptInputs {
                segment,
                reason: reason.clone(),
            }),
            None => Ok(()),
        }
    }

    fn send(&mut self, segment: usize, job: Job) -> Result<(), GptError> {
        let sent = self
            .jobs
            .as_ref()
            .is_some_and(|jobs| jobs.send(job).is_ok());
        if !sent {
            return Err(self.fail(segment, "the copy thread stopped".into()));
        }
        self.in_flight += 1;
        Ok(())
    }

    /// Waits for the oldest queued copy (callers check `in_flight > 0`) and files its slot.
    fn collect_one(&mut self, segment: usize) -> Result<(), GptError> {
        let Ok(done) = self.done.recv() else {
            return Err(self.fail(segment, "the copy thread stopped (a copy panicked)".into()));
        };
        self.in_flight -= 1;
        if let Err(reason) = done.result {
            return Err(self.fail(done.segment, reason));
        }
        let current = done.fetch.and_then(|id| {
            let at = self.fetching.iter().position(|&(_, f)| f == id)?;
            Some(self.fetching.remove(at))
        });
        match current {
            Some(_) => self.fetched.push((done.segment, done.slot)),
            None => self.free.push(done.slot),
        }
        Ok(())
    }

    /// A free slot: waits for queued copies to hand one back, or reuses the oldest fetched
    /// slot (its segment stays on host and can be fetched again).
    fn free_slot(&mut self, segment: usize) -> Result<Buffer, GptError> {
        loop {
            if let Some(slot) = self.free.pop() {
                return Ok(slot);
            }
            if self.in_flight > 0 {
                self.collect_one(segment)?;
            } else if !self.fetched.is_empty() {
                return Ok(self.fetched.remove(0).1);
            } else {
                return Err(self.fail(segment, "no staging slot".into()));
            }
        }
    }

    fn fetch_pending(&self, segment: usize) -> bool {
        self.fetched.iter().any(|&(s, _)| s == segment)
            || self.fetching.iter().any(|&(s, _)| s == segment)
    }
}

impl KeptInputs for OffloadedInputs {
    fn shape(&self) -> (usize, usize) {
        self.shape
    }

    fn keep(&mut self, segment: usize, input: &[f32]) -> Result<(), GptError> {
        self.check(segment, input.len())?;
        // Fetches of this segment's previous input are stale now.
        self.fetching.retain(|&(s, _)| s != segment);
        while let Some(at) = self.fetched.iter().position(|&(s, _)| s == segment) {
            let (_, slot) = self.fetched.remove(at);
            self.free.push(slot);
        }
        let mut slot = self.free_slot(segment)?;
        slot.floats_mut().copy_from_slice(input);
        self.send(segment, Job::ToHost { segment, slot })?;
        self.record(OffloadEvent::KeepQueued(segment));
        Ok(())
    }

    fn due_next(&mut self, segment: usize) -> Result<(), GptError> {
        self.check(segment, self.shape.1)?;
        if self.fetch_pending(segment) {
            return Ok(());
        }
        let slot = self.free_slot(segment)?;
        let fetch = self.next_fetch;
        self.next_fetch += 1;
        let job = Job::ToSlot {
            segment,
            slot,
            fetch,
        };
        self.send(segment, job)?;
        self.fetching.push((segment, fetch));
        self.record(OffloadEvent::FetchQueued(segment));
        Ok(())
    }

    fn restore(&mut self, segment: usize, input: &mut [f32]) -> Result<(), GptError> {
        self.check(segment, input.len())?;
        let fetched_ahead = self.fetch_pending(segment);
        self.due_next(segment)?;
        let slot = loop {
            if let Some(at) = self.fetched.iter().position(|&(s, _)| s == segment) {
                break self.fetched.remove(at).1;
            }
            if self.in_flight == 0 {
                return Err(self.fail(segment, "its fetch was lost".into()));
            }
            self.collect_one(segment)?;
        };
        input.copy_from_slice(slot.floats());
        self.free.push(slot);
        self.record(OffloadEvent::Restored {
            segment,
            fetched_ahead,
        });
        Ok(())
    }

    fn resident_bytes(&self) -> u64 {
        self.slot_bytes
    }

    fn offloaded_bytes(&self) -> u64 {
        self.host_bytes
    }
}

impl Drop for OffloadedInputs {
    fn drop(&mut self) {
        // Closing the job channel ends the thread's loop once the queued copies are done.
        drop(self.jobs.take());
        if let Some(thread) = self.thread.take() {
            // A panicked thread has already been reported by the call that met it.
            let _ = thread.join();
        }
    }
}

/// The copy thread: runs jobs in order until the job channel closes.
fn copy_loop(mut hosts: Vec<PinnedBuffer>, jobs: &Receiver<Job>, done: &Sender<Done>) {
    for job in jobs {
        let (segment, mut slot, fetch) = match job {
            Job::ToHost { segment, slot } => (segment, slot, None),
            Job::ToSlot {
                segment,
                slot,
                fetch,
            } => (segment, slot, Some(fetch)),
            #[cfg(test)]
            Job::Panic => panic!("a copy job panicked (injected by a test)"),
        };
        let result = match hosts.get_mut(segment) {
            Some(host) => copy(host, slot.floats_mut(), fetch.is_none()),
            None => Err(format!("no host buffer for segment {segment}")),
        };
        let reply = Done {
            segment,
            slot,
            fetch,
            result,
        };
        if done.send(reply).is_err() {
            return;
        }
    }
}

fn copy(host: &mut PinnedBuffer, slot: &mut [f32], to_host: bool) -> Result<(), String> {
    let host = host.as_slice_mut::<f32>().map_err(|e| e.to_string())?;
    if host.len() != slot.len() {
        return Err(format!("host {} vs slot {} floats", host.len(), slot.len()));
    }
    if to_host {
        host.copy_from_slice(slot);
    } else {
        slot.copy_from_slice(host);
    }
    Ok(())
}

#[cfg(test)]
mod tests;
