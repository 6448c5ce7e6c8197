//! The I/O thread of the optimizer's file tier: one per rank, started with its file, which
//! writes and reads the pieces it is asked to in the order asked, each through its own
//! buffer of the tier's pool, and answers every job in order with the blocks it was lent.
//!
//! A job's blocks are host arena blocks lent to it ([`Arena::lend`](zero_alloc::Arena::lend):
//! pinned, so the arena neither views, moves nor frees them) until the reply hands them
//! back, so the update and the I/O never touch the same bytes.

use super::planning::offload_plan::FileLayout;
use super::trace::{Lane, Span};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;
use zero_alloc::tier::{ChunkPool, TierFile};
use zero_alloc::Lent;

/// A unit and one of its pieces (the index into the unit's kept range, in pieces).
pub(crate) type PieceId = (usize, usize);

/// Work for the I/O thread: write the lent blocks (one per state, in the file's order) as
/// piece `write`, then read piece `read` into them.
pub(crate) struct Job {
    pub write: Option<PieceId>,
    pub read: Option<PieceId>,
    pub bufs: Vec<Lent<u8>>,
}

/// The I/O thread's answer: the blocks back, the (read, written) bytes, a span per
/// direction (its time in the file's reads and writes), and how it went.
pub(crate) struct Done {
    pub bufs: Vec<Lent<u8>>,
    pub moved: (u64, u64),
    pub spans: Vec<Span>,
    pub result: zero_alloc::Result<()>,
}

/// The thread and its two channels.
#[derive(Debug)]
pub(crate) struct IoThread {
    jobs: Option<Sender<Job>>,
    done: Receiver<Done>,
    handle: Option<JoinHandle<()>>,
}

impl IoThread {
    /// Starts the thread over `tier` laid out as `layout`, with a pool of its own.
    pub fn spawn(
        tier: Arc<TierFile>,
        layout: FileLayout,
        pool: ChunkPool,
    ) -> std::io::Result<Self> {
        let (jobs, job_rx) = channel::<Job>();
        let (done_tx, done) = channel();
        let io = Io { tier, layout, pool };
        let handle = std::thread::Builder::new()
            .name("zero-optimizer-io".into())
            .spawn(move || io.serve(&job_rx, &done_tx))?;
        Ok(Self {
            jobs: Some(jobs),
            done,
            handle: Some(handle),
        })
    }

    /// Sends `job`; on a thread that is gone, hands the job back.
    pub fn send(&self, job: Job) -> Result<(), Job> {
        match &self.jobs {
            Some(jobs) => jobs.send(job).map_err(|unsent| unsent.0),
            None => Err(job),
        }
    }

    /// The next reply, in the order the jobs were sent; `None` when the thread is gone.
    pub fn receive(&self) -> Option<Done> {
        self.done.recv().ok()
    }
}

impl Drop for IoThread {
    fn drop(&mut self) {
        // Closing the job channel ends the thread's loop; what it still answers is dropped.
        self.jobs.take();
        if let Some(handle) = self.handle.take() {
            // A thread that panicked has nothing left to clean up.
            let _ = handle.join();
        }
    }
}

/// The thread's side: the file, its layout and the thread's pool buffer.
struct Io {
    tier: Arc<TierFile>,
    layout: FileLayout,
    pool: ChunkPool,
}

impl Io {
    /// Answers `jobs` in order until the job channel closes or no one takes the replies.
    fn serve(mut self, jobs: &Receiver<Job>, done: &Sender<Done>) {
        for mut job in jobs {
            let (mut moved, mut spans) = ((0, 0), Vec::new());
            let result = self.run(&mut job, &mut moved, &mut spans);
            let reply = Done {
                bufs: job.bufs,
                moved,
                spans,
                result,
            };
            if done.send(reply).is_err() {
                break;
            }
        }
    }

    /// Writes then reads `job`'s pieces, counting (read, written) bytes into `moved` and a
    /// span per direction into `spans`.
    fn run(
        &mut self,
        job: &mut Job,
        moved: &mut (u64, u64),
        spans: &mut Vec<Span>,
    ) -> zero_alloc::Result<()> {
        if let Some((unit, k)) = job.write {
            let start = Instant::now();
            let mut bytes = 0;
            for (state, buf) in job.bufs.iter().enumerate() {
                let index = self.layout.index(unit, k, state);
                let len = self.layout.lens[index] as usize;
                self.tier
                    .write_piece(index, &buf.as_ref()[..len], &mut self.pool)?;
                bytes += len as u64;
            }
            moved.1 += bytes;
            spans.push(file_span(
                format!("write unit {unit} piece {k}"),
                start,
                bytes,
            ));
        }
        if let Some((unit, k)) = job.read {
            let start = Instant::now();
            let mut bytes = 0;
            for (state, buf) in job.bufs.iter_mut().enumerate() {
                let index = self.layout.index(unit, k, state);
                let len = self.layout.lens[index] as usize;
                self.tier
                    .read_piece(index, &mut buf.as_mut()[..len], &mut self.pool)?;
                bytes += len as u64;
            }
            moved.0 += bytes;
            spans.push(file_span(
                format!("read unit {unit} piece {k}"),
                start,
                bytes,
            ));
        }
        Ok(())
    }
}

/// A span of the file's lane from `start` until now that moved `bytes`.
fn file_span(name: String, start: Instant, bytes: u64) -> Span {
    Span {
        name,
        lane: Lane::File,
        start,
        end: Instant::now(),
        bytes: Some(bytes),
    }
}
