//! The offload protocol (steps 1-3 of the module docs), written once over a [`Copier`]: what
//! moves inputs between the model, the staging slots and host memory. The CPU's copier is a
//! thread (`copy_thread`); a GPU's is a copy stream ordered by events (`cuda`, feature
//! `cuda`). The slots' bookkeeping (`slots`) and the events are the same for both.

use std::fmt;

use zero_gpt::{check_kept_call, GptError, KeptInputs, View};

use super::events::{EventLog, OffloadEvent};
use super::slots::StagingSlots;

/// One copy between a staging slot and segment `segment`'s host buffer.
pub(crate) enum Job<S> {
    ToHost {
        segment: usize,
        slot: S,
    },
    ToSlot {
        segment: usize,
        slot: S,
        fetch: u64,
    },
    #[cfg(test)]
    Panic,
}

/// A job's copy: its segment, its slot, and the fetch's id (`None` for a copy to host).
pub(crate) type Parts<S> = (usize, S, Option<u64>);

impl<S> Job<S> {
    /// The copy this job asks for; `None` for the test's injected failure.
    pub(crate) fn into_parts(self) -> Option<Parts<S>> {
        match self {
            Job::ToHost { segment, slot } => Some((segment, slot, None)),
            Job::ToSlot {
                segment,
                slot,
                fetch,
            } => Some((segment, slot, Some(fetch))),
            #[cfg(test)]
            Job::Panic => None,
        }
    }
}

/// A completed job (or, on a GPU, one ordered on its copy stream), handing its slot back.
#[derive(Debug)]
pub(crate) struct Done<S> {
    pub(crate) segment: usize,
    pub(crate) slot: S,
    /// The fetch's id, or `None` for a copy to host.
    pub(crate) fetch: Option<u64>,
    pub(crate) result: Result<(), String>,
}

/// What runs the copies. Jobs complete in the order they were queued: a fetch of segment s
/// queued after a keep of s reads what was kept.
pub(crate) trait Copier: Send + fmt::Debug {
    /// A staging slot: one (N,C) input of the rank's memory.
    type Slot: Send + fmt::Debug;
    /// The model's view of an input.
    type View: View + ?Sized;

    /// Floats in `slot`.
    fn slot_len(slot: &Self::Slot) -> usize;

    /// Queues `job`.
    ///
    /// # Errors
    /// Why it could not be queued (the copier stopped, a refused enqueue).
    fn send(&mut self, job: Job<Self::Slot>) -> Result<(), String>;

    /// Jobs queued and not yet collected.
    fn in_flight(&self) -> usize;

    /// The oldest queued job's completion; `None` when the copier stopped.
    fn recv(&mut self) -> Option<Done<Self::Slot>>;

    /// `slot = input`, in order with the model's kernels and the slot's last copy.
    ///
    /// # Errors
    /// A refused copy.
    fn stage(&mut self, slot: &mut Self::Slot, input: &Self::View) -> Result<(), String>;

    /// `input = slot`, in order with the model's kernels and the slot's last copy.
    ///
    /// # Errors
    /// A refused copy.
    fn unstage(&mut self, slot: &Self::Slot, input: &mut Self::View) -> Result<(), String>;
}

/// [`KeptInputs`] in host memory behind staging slots, over copier `C` (module docs).
#[derive(Debug)]
pub(crate) struct Offloader<C: Copier> {
    // Declared first so it is dropped first: a copier's drop waits for its copies, which
    // may still use the slots below.
    copier: C,
    slots: StagingSlots<C::Slot>,
    shape: (usize, usize),
    slot_bytes: u64,
    host_bytes: u64,
    failure: Option<String>,
    log: Option<EventLog>,
}

impl<C: Copier> Offloader<C> {
    /// The protocol over `copier`, which holds `segments` host buffers of `input_len`
    /// floats, staged through `slots`.
    ///
    /// # Errors
    /// [`GptError::SizeMismatch`] for a slot of another size, or no slot.
    pub(crate) fn new(
        copier: C,
        slots: Vec<C::Slot>,
        segments: usize,
        input_len: usize,
    ) -> Result<Self, GptError> {
        let bad = |what, got| GptError::SizeMismatch {
            what,
            expected: input_len,
            got,
        };
        if let Some(slot) = slots.iter().find(|s| C::slot_len(s) != input_len) {
            return Err(bad("offload staging slot", C::slot_len(slot)));
        }
        if slots.is_empty() && segments > 0 {
            return Err(bad("offload staging slots", 0));
        }
        Ok(Self {
            copier,
            slot_bytes: 4 * (slots.len() * input_len) as u64,
            host_bytes: 4 * (segments * input_len) as u64,
            slots: StagingSlots::new(slots),
            shape: (segments, input_len),
            failure: None,
            log: None,
        })
    }

    /// Records every [`OffloadEvent`] into `log` from now on.
    pub(crate) fn set_event_log(&mut self, log: EventLog) {
        self.log = Some(log);
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

    pub(crate) fn send(&mut self, segment: usize, job: Job<C::Slot>) -> Result<(), GptError> {
        self.copier
            .send(job)
            .map_err(|reason| self.fail(segment, reason))
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
    fn free_slot(&mut self, segment: usize) -> Result<C::Slot, GptError> {
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

impl<C: Copier> KeptInputs<C::View> for Offloader<C> {
    fn shape(&self) -> (usize, usize) {
        self.shape
    }

    fn keep(&mut self, segment: usize, input: &C::View) -> Result<(), GptError> {
        self.check(segment, input.len())?;
        self.slots.forget(segment);
        let mut slot = self.free_slot(segment)?;
        if let Err(reason) = self.copier.stage(&mut slot, input) {
            self.slots.release(slot);
            return Err(self.fail(segment, reason));
        }
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

    fn restore(&mut self, segment: usize, input: &mut C::View) -> Result<(), GptError> {
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
        let unstaged = self.copier.unstage(&slot, input);
        self.slots.release(slot);
        unstaged.map_err(|reason| self.fail(segment, reason))?;
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
