//! Kept block inputs offloaded to pinned host memory (`--offload-activations`, ZeRO-R's
//! P_a + cpu), copied out and back on a copy thread so the copies overlap compute.
//!
//! Legend: N = B*T positions, C channels, S segments = ceil(L/K).
//!
//! The rank's arena holds only [`STAGING_SLOTS`] slots of one (N,C) input each; host memory
//! holds one pinned (N,C) buffer per segment, owned by the copy thread (`copy_thread`, which
//! also says why the order of copies and a panicked thread are safe). The protocol:
//! 1. `keep(s)`: copy the model's input into a free slot and queue "slot -> host s"; forward
//!    goes on while the thread copies (it waits only when both slots are still queued).
//! 2. `due_next(s)`: take a free slot and queue "host s -> slot"; the model gives this hint
//!    when its last segment starts (S-2 is restored first) and right after each restore.
//! 3. `restore(s)`: wait for that fetch (queued one recompute and backward of a segment
//!    earlier), copy the slot into the model's input and free it. A segment never hinted is
//!    fetched there and then.

mod copy_thread;
mod events;
mod slots;

use zero::Engine;
use zero_alloc::PinnedBuffer;
use zero_gpt::{check_kept_call, Buffer, GptError, KeptInputs};

use crate::bridge::StepError;
use copy_thread::{CopyThread, Job};
pub use events::{EventLog, OffloadEvent};
use slots::StagingSlots;

/// Slots of one (N,C) input the arena holds with offload (fewer when there are fewer
/// segments): one being copied out or in while the model reads or writes the other.
pub const STAGING_SLOTS: usize = 2;

/// Staging slots for `segments` segments.
#[must_use]
pub fn staging_slots(segments: usize) -> usize {
    STAGING_SLOTS.min(segments)
}

/// [`KeptInputs`] in pinned host memory behind [`STAGING_SLOTS`] arena slots (module docs).
#[derive(Debug)]
pub struct OffloadedInputs {
    copier: CopyThread,
    slots: StagingSlots,
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
        let segments = hosts.len();
        Ok(Self {
            copier: CopyThread::spawn(hosts)?,
            slot_bytes: 4 * (slots.len() * input_len) as u64,
            host_bytes: 4 * (segments * input_len) as u64,
            slots: StagingSlots::new(slots),
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
        if !self.copier.send(job) {
            return Err(self.fail(segment, "the copy thread stopped".into()));
        }
        Ok(())
    }

    /// Waits for the oldest queued copy (callers check it has one in flight) and files its
    /// slot.
    fn collect_one(&mut self, segment: usize) -> Result<(), GptError> {
        let Some(done) = self.copier.recv() else {
            return Err(self.fail(segment, "the copy thread stopped (a copy panicked)".into()));
        };
        if let Err(reason) = done.result {
            return Err(self.fail(done.segment, reason));
        }
        self.slots
            .file_completed(done.segment, done.slot, done.fetch);
        Ok(())
    }

    /// A free slot: waits for queued copies to hand one back, or reuses the oldest fetched
    /// slot (its segment stays on host and can be fetched again).
    fn free_slot(&mut self, segment: usize) -> Result<Buffer, GptError> {
        loop {
            if let Some(slot) = self.slots.pop_free() {
                return Ok(slot);
            }
            if self.copier.in_flight() > 0 {
                self.collect_one(segment)?;
            } else if let Some(slot) = self.slots.take_oldest_fetched() {
                return Ok(slot);
            } else {
                return Err(self.fail(segment, "no staging slot".into()));
            }
        }
    }
}

impl KeptInputs for OffloadedInputs {
    fn shape(&self) -> (usize, usize) {
        self.shape
    }

    fn keep(&mut self, segment: usize, input: &[f32]) -> Result<(), GptError> {
        self.check(segment, input.len())?;
        self.slots.forget(segment);
        let mut slot = self.free_slot(segment)?;
        slot.floats_mut().copy_from_slice(input);
        self.send(segment, Job::ToHost { segment, slot })?;
        self.record(OffloadEvent::KeepQueued(segment));
        Ok(())
    }

    fn due_next(&mut self, segment: usize) -> Result<(), GptError> {
        self.check(segment, self.shape.1)?;
        if self.slots.fetch_pending(segment) {
            return Ok(());
        }
        let slot = self.free_slot(segment)?;
        let fetch = self.slots.next_fetch_id();
        let job = Job::ToSlot {
            segment,
            slot,
            fetch,
        };
        self.send(segment, job)?;
        self.slots.fetch_queued(segment, fetch);
        self.record(OffloadEvent::FetchQueued(segment));
        Ok(())
    }

    fn restore(&mut self, segment: usize, input: &mut [f32]) -> Result<(), GptError> {
        self.check(segment, input.len())?;
        let fetched_ahead = self.slots.fetch_pending(segment);
        self.due_next(segment)?;
        let slot = loop {
            if let Some(slot) = self.slots.take_fetched(segment) {
                break slot;
            }
            if self.copier.in_flight() == 0 {
                return Err(self.fail(segment, "its fetch was lost".into()));
            }
            self.collect_one(segment)?;
        };
        input.copy_from_slice(slot.floats());
        self.slots.release(slot);
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

#[cfg(test)]
mod tests;
