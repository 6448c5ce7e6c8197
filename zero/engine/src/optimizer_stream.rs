//! One unit's update with its optimizer states in the file tier (`--offload-optimizer
//! nvme`): the states of each piece are read from the file into a slot of host arena
//! blocks, updated by the same host AdamW as without the file, and written back.
//!
//! Two slots alternate, and one I/O thread per update does the file's reads and writes in
//! the order they are asked for: while the host updates piece k in one slot, the thread
//! writes piece k-1 back from the other and then reads piece k+1 into it. A slot is lent to
//! the thread ([`Arena::lend`]: pinned, so the arena neither views nor frees it) from the
//! moment its job is sent until its reply is taken back, so the update and the I/O never
//! touch the same bytes. Jobs are answered in the order sent, so the reply to piece k's
//! read is the next one after piece k-1's.

use super::error::{Error, Result};
use super::kernels::{AdamWStep, HostKernels, Span as BlockSpan};
use super::optimizer_file::FileStates;
use super::optimizer_home::{update_piece, OffloadedOptimizer, OptimSpans, Piece, Staging};
use super::planning::offload_plan::FileLayout;
use super::precision::Store;
use super::trace::{Lane, Span, Trace};
use super::unit_buffers::UnitBuffers;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::time::Instant;
use zero_alloc::tier::{ChunkPool, TierFile};
use zero_alloc::{Arena, Handle, Lent};

/// One piece's states in the host arena: m, v (and the master weights), `len` f32 each.
#[derive(Clone)]
struct Slot {
    blocks: Vec<Handle>,
}

/// Work for the I/O thread: write the lent blocks as file piece `write` (each state its
/// own file piece), then read piece `read` into them.
struct Job {
    write: Option<usize>,
    read: Option<usize>,
    bufs: Vec<Lent<u8>>,
}

/// The I/O thread's answer: the blocks back, what moved, when, and how it went.
struct Done {
    bufs: Vec<Lent<u8>>,
    moved: (u64, u64),
    spans: Vec<Span>,
    result: zero_alloc::Result<()>,
}

/// `unit`'s update from and back to `host`'s file: `range` is (the owned range's first
/// piece, its length, the kept length).
pub(crate) fn update_from_file<S: Store>(
    device: &mut Arena,
    host: &mut OffloadedOptimizer,
    (unit, b): (usize, &UnitBuffers),
    (first, owned, kept): (Piece, usize, usize),
    step: &AdamWStep<'_>,
    trace: Option<&mut Trace>,
) -> Result<()> {
    let OffloadedOptimizer {
        arena,
        kernels,
        file,
        ..
    } = host;
    let file = file
        .as_mut()
        .ok_or_else(|| Error::Order("no optimizer file".into()))?;
    if first.optim != 0 {
        return Err(Error::Order(format!(
            "an owned range at element {} of its kept block: the file's pieces start at 0",
            first.optim
        )));
    }
    let piece = file.layout.piece;
    let stage = Staging::new(arena, S::DTYPE, owned.min(piece))?;
    let slots = match alloc_slots(arena, file.layout.states, kept.min(piece).max(1)) {
        Ok(slots) => slots,
        Err(e) => {
            // The allocation's failure explains more than a failure to free after it.
            let _ = stage.free(arena);
            return Err(e);
        }
    };
    let FileStates {
        tier,
        pool,
        layout,
        read_bytes,
        written_bytes,
    } = file;
    let streamed = std::thread::scope(|scope| {
        let (jobs, job_rx) = channel();
        let (done_tx, done) = channel();
        let io = Io { tier, pool, layout };
        scope.spawn(move || io.serve(unit, &job_rx, &done_tx));
        let mut stream = Stream {
            arena,
            jobs,
            done,
            sent: 0,
            moved: (0, 0),
            trace,
        };
        let pieces = (first, owned, piece);
        let ran = stream.run::<S>(device, kernels, (&stage, &slots), b, pieces, step);
        let drained = stream.drain();
        *read_bytes += stream.moved.0;
        *written_bytes += stream.moved.1;
        ran.and(drained)
    });
    let freed = slots
        .iter()
        .flat_map(|s| &s.blocks)
        .try_for_each(|&h| arena.free(h));
    streamed
        .and(freed.map_err(Error::from))
        .and(stage.free(arena))
}

/// Two slots of `states` blocks of `len` f32, or none (what was allocated is freed).
fn alloc_slots(arena: &mut Arena, states: usize, len: usize) -> Result<[Slot; 2]> {
    let mut blocks = Vec::with_capacity(2 * states);
    for _ in 0..2 * states {
        match arena.alloc_elems::<f32>(len) {
            Ok(h) => blocks.push(h),
            Err(e) => {
                for h in blocks {
                    arena.free(h)?;
                }
                return Err(e.into());
            }
        }
    }
    let second = blocks.split_off(states);
    Ok([Slot { blocks }, Slot { blocks: second }])
}

/// The I/O thread's view of the file.
struct Io<'a> {
    tier: &'a TierFile,
    pool: &'a mut ChunkPool,
    layout: &'a FileLayout,
}

impl Io<'_> {
    /// Answers `jobs` in order until the update drops its sender.
    fn serve(mut self, unit: usize, jobs: &Receiver<Job>, done: &Sender<Done>) {
        for mut job in jobs {
            let (mut moved, mut spans) = ((0, 0), Vec::new());
            let result = self.run(unit, &mut job, &mut moved, &mut spans);
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
        unit: usize,
        job: &mut Job,
        moved: &mut (u64, u64),
        spans: &mut Vec<Span>,
    ) -> zero_alloc::Result<()> {
        if let Some(k) = job.write {
            let start = Instant::now();
            let mut bytes = 0;
            for (state, buf) in job.bufs.iter().enumerate() {
                let index = self.layout.index(unit, k, state);
                let len = self.layout.lens[index] as usize;
                self.tier
                    .write_piece(index, &buf.as_ref()[..len], self.pool)?;
                bytes += len as u64;
            }
            moved.1 += bytes;
            spans.push(file_span(
                format!("write unit {unit} piece {k}"),
                start,
                bytes,
            ));
        }
        if let Some(k) = job.read {
            let start = Instant::now();
            let mut bytes = 0;
            for (state, buf) in job.bufs.iter_mut().enumerate() {
                let index = self.layout.index(unit, k, state);
                let len = self.layout.lens[index] as usize;
                self.tier
                    .read_piece(index, &mut buf.as_mut()[..len], self.pool)?;
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

/// The update's side of the I/O thread: the host arena, the channels, and how many jobs
/// were sent (the replies taken back are the pieces updated so far, plus those drained).
struct Stream<'a> {
    arena: &'a mut Arena,
    jobs: Sender<Job>,
    done: Receiver<Done>,
    sent: usize,
    moved: (u64, u64),
    /// The timeline being recorded, which takes the I/O thread's spans.
    trace: Option<&'a mut Trace>,
}

impl Stream<'_> {
    /// Every piece of the `owned` elements from `first`, `piece` at a time: read ahead two
    /// slots deep, updated, written back.
    fn run<S: Store>(
        &mut self,
        device: &mut Arena,
        kernels: &HostKernels,
        (stage, slots): (&Staging, &[Slot; 2]),
        b: &UnitBuffers,
        (first, owned, piece): (Piece, usize, usize),
        step: &AdamWStep<'_>,
    ) -> Result<()> {
        let n = owned.div_ceil(piece);
        for (k, slot) in slots.iter().enumerate().take(n) {
            self.send(slot, None, Some(k))?;
        }
        for k in 0..n {
            let slot = &slots[k % 2];
            self.receive()?;
            let start = k * piece;
            let at = first.advanced(start, piece.min(owned - start));
            let step = AdamWStep {
                offset: step.offset + start,
                ..*step
            };
            let span = |s: usize| BlockSpan::new(slot.blocks[s], 0..at.len);
            let optim = OptimSpans {
                m: span(0),
                v: span(1),
                master: (slot.blocks.len() > 2).then(|| span(2)),
            };
            update_piece::<S>(device, (self.arena, kernels), stage, b, at, optim, &step)?;
            self.send(slot, Some(k), (k + 2 < n).then_some(k + 2))?;
        }
        Ok(())
    }

    /// Lends `slot`'s blocks to the I/O thread with a job.
    fn send(&mut self, slot: &Slot, write: Option<usize>, read: Option<usize>) -> Result<()> {
        let mut bufs = Vec::with_capacity(slot.blocks.len());
        for &h in &slot.blocks {
            match self.arena.lend::<u8>(h) {
                Ok(lent) => bufs.push(lent),
                Err(e) => {
                    for lent in bufs {
                        self.arena.take_back(lent)?;
                    }
                    return Err(e.into());
                }
            }
        }
        let job = Job { write, read, bufs };
        if let Err(unsent) = self.jobs.send(job) {
            // The job comes back unsent: its slot is taken back, not left lent.
            for lent in unsent.0.bufs {
                self.arena.take_back(lent)?;
            }
            return Err(Error::Order(
                "the optimizer file's I/O thread is gone".into(),
            ));
        }
        self.sent += 1;
        Ok(())
    }

    /// Takes the next reply's blocks back into the arena; its I/O error, if any.
    fn receive(&mut self) -> Result<()> {
        let Ok(reply) = self.done.recv() else {
            // A thread gone (it panicked) answers nothing more: its slots stay lent, and
            // freeing them fails, which the update reports after this error.
            self.sent = 0;
            return Err(Error::Order(
                "the optimizer file's I/O thread is gone".into(),
            ));
        };
        self.sent -= 1;
        self.moved.0 += reply.moved.0;
        self.moved.1 += reply.moved.1;
        if let Some(trace) = self.trace.as_deref_mut() {
            trace.spans.extend(reply.spans);
        }
        for lent in reply.bufs {
            self.arena.take_back(lent)?;
        }
        Ok(reply.result?)
    }

    /// Takes back every job still out (after the last piece, or after a failure), so that
    /// no slot stays lent; the first error.
    fn drain(&mut self) -> Result<()> {
        let mut first = Ok(());
        while self.sent > 0 {
            let taken = self.receive();
            first = first.and(taken);
        }
        first
    }
}
