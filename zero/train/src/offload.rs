//! Kept block inputs offloaded to pinned host memory (`--offload-activations`, ZeRO-R's
//! P_a + cpu), copied out and back on a copy thread so the copies overlap compute.
//!
//! Legend: N = B*T positions, C channels, S segments = ceil(L/K).
//!
//! The rank's arena holds only [`STAGING_SLOTS`] slots of one (N,C) input each; host memory
//! holds one pinned (N,C) buffer per segment, owned by the copier that runs the copies: on
//! the CPU a copy thread (`copy_thread`, which also says why the order of copies and a
//! panicked thread are safe), on a GPU a copy stream ordered against the compute stream by
//! events (`cuda`, feature `cuda`, with its soundness argument). The protocol, written once
//! over both (`protocol`; the slots' bookkeeping in `slots`):
//! 1. `keep(s)`: copy the model's input into a free slot and queue "slot -> host s"; forward
//!    goes on while the thread copies (it waits only when both slots are still queued).
//! 2. `due_next(s)`: take a free slot and queue "host s -> slot"; the model gives this hint
//!    when its last segment starts (S-2 is restored first) and right after each restore.
//! 3. `restore(s)`: wait for that fetch (queued one recompute and backward of a segment
//!    earlier), copy the slot into the model's input and free it. A segment never hinted is
//!    fetched there and then. (On a GPU the waits are the compute stream's, on events: the
//!    host does not wait.)

mod copy_thread;
#[cfg(feature = "cuda")]
pub(crate) mod cuda;
mod events;
mod protocol;
mod slots;

use zero::Engine;
use zero_alloc::PinnedBuffer;
use zero_gpt::{Buffer, GptError, KeptInputs};

use crate::bridge::StepError;
use copy_thread::CopyThread;
pub use events::{EventLog, OffloadEvent};
use protocol::Offloader;

/// Slots of one (N,C) input the arena holds with offload (fewer when there are fewer
/// segments): one being copied out or in while the model reads or writes the other.
pub const STAGING_SLOTS: usize = 2;

/// Staging slots for `segments` segments.
#[must_use]
pub fn staging_slots(segments: usize) -> usize {
    STAGING_SLOTS.min(segments)
}

/// Bytes of one (N,C) input of `input_len` floats.
fn input_bytes(input_len: usize) -> Result<usize, GptError> {
    input_len.checked_mul(4).ok_or(GptError::KeptInputs {
        segment: 0,
        reason: "input bytes overflow usize".into(),
    })
}

/// [`KeptInputs`] in pinned host memory behind [`STAGING_SLOTS`] arena slots, copied by a
/// thread (module docs).
#[derive(Debug)]
pub struct OffloadedInputs(Offloader<CopyThread>);

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
    let bytes = input_bytes(input_len)?;
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
        check_hosts(&hosts, input_len)?;
        let segments = hosts.len();
        let copier = CopyThread::spawn(hosts)?;
        Ok(Self(Offloader::new(copier, slots, segments, input_len)?))
    }

    /// Records every [`OffloadEvent`] into `log` from now on.
    #[must_use]
    pub fn with_event_log(mut self, log: EventLog) -> Self {
        self.0.set_event_log(log);
        self
    }
}

/// Refuses a host buffer that is not `input_len` floats.
fn check_hosts(hosts: &[PinnedBuffer], input_len: usize) -> Result<(), GptError> {
    match hosts
        .iter()
        .find(|h| h.len() % 4 != 0 || h.len() / 4 != input_len)
    {
        Some(host) => Err(GptError::SizeMismatch {
            what: "offload host buffer (floats)",
            expected: input_len,
            got: host.len() / 4,
        }),
        None => Ok(()),
    }
}

impl KeptInputs for OffloadedInputs {
    fn shape(&self) -> (usize, usize) {
        self.0.shape()
    }

    fn keep(&mut self, segment: usize, input: &[f32]) -> Result<(), GptError> {
        self.0.keep(segment, input)
    }

    fn due_next(&mut self, segment: usize) -> Result<(), GptError> {
        self.0.due_next(segment)
    }

    fn restore(&mut self, segment: usize, input: &mut [f32]) -> Result<(), GptError> {
        self.0.restore(segment, input)
    }

    fn resident_bytes(&self) -> u64 {
        self.0.resident_bytes()
    }

    fn offloaded_bytes(&self) -> u64 {
        self.0.offloaded_bytes()
    }
}

#[cfg(test)]
mod stream_tests;
#[cfg(test)]
mod tests;
