//! The copy thread and its protocol: it owns the pinned host buffers, one per segment, and
//! runs copy jobs between them and arena slots in the order they were queued.
//!
//! In-order execution is what makes a fetch of segment s queued after `keep(s)` read what
//! was kept. Slots move into a job and come back with its completion: safe Rust, no shared
//! memory. A thread that panics drops its end of the channels, so the next call that waits
//! on it gets an error (and every call after it), never a hang. zero_alloc's `CopyEngine`
//! is not used: it copies arena blocks named by handle, and the activations' blocks are lent
//! out of the engine's arena (`Engine::lend_f32`), which hands out no handle.

use std::sync::mpsc::{self, Receiver, Sender};
use std::thread::JoinHandle;

use zero_alloc::PinnedBuffer;
use zero_gpt::{Buffer, GptError};

use super::protocol::{Copier, Done, Job};

/// The main thread's end of the copy thread: the two channels, the handle, and how many
/// queued jobs have not been collected.
#[derive(Debug)]
pub(crate) struct CopyThread {
    jobs: Option<Sender<Job<Buffer>>>,
    done: Receiver<Done<Buffer>>,
    thread: Option<JoinHandle<()>>,
    in_flight: usize,
}

impl CopyThread {
    /// Starts the thread that owns `hosts`.
    ///
    /// # Errors
    /// [`GptError::KeptInputs`] when the OS refuses the thread.
    pub(super) fn spawn(hosts: Vec<PinnedBuffer>) -> Result<Self, GptError> {
        let (jobs, job_rx) = mpsc::channel();
        let (done_tx, done) = mpsc::channel();
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
            in_flight: 0,
        })
    }
}

impl Copier for CopyThread {
    type Slot = Buffer;
    type View = [f32];

    fn slot_len(slot: &Buffer) -> usize {
        slot.floats().len()
    }

    fn send(&mut self, job: Job<Buffer>) -> Result<(), String> {
        let sent = self
            .jobs
            .as_ref()
            .is_some_and(|jobs| jobs.send(job).is_ok());
        if !sent {
            return Err("the copy thread stopped".into());
        }
        self.in_flight += 1;
        Ok(())
    }

    fn in_flight(&self) -> usize {
        self.in_flight
    }

    fn recv(&mut self) -> Option<Done<Buffer>> {
        let done = self.done.recv().ok()?;
        self.in_flight -= 1;
        Some(done)
    }

    fn stage(&mut self, slot: &mut Buffer, input: &[f32]) -> Result<(), String> {
        slot.floats_mut().copy_from_slice(input);
        Ok(())
    }

    fn unstage(&mut self, slot: &Buffer, input: &mut [f32]) -> Result<(), String> {
        input.copy_from_slice(slot.floats());
        Ok(())
    }
}

impl Drop for CopyThread {
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
fn copy_loop(
    mut hosts: Vec<PinnedBuffer>,
    jobs: &Receiver<Job<Buffer>>,
    done: &Sender<Done<Buffer>>,
) {
    for job in jobs {
        let Some((segment, mut slot, fetch)) = job.into_parts() else {
            panic!("a copy job panicked (injected by a test)");
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
