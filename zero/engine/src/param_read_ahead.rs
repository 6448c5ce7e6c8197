//! Reads of the parameter file ahead of their gathers (`--offload-params nvme`): an I/O
//! thread of the rank reads the shards of the units the running program gathers next into
//! blocks of a host arena of their own, within a look-ahead budget
//! ([`EngineConfig::nvme_prefetch_bytes`](crate::EngineConfig)), so that a gather finds its
//! shard in memory instead of waiting for the file.
//!
//! The protocol, on the engine's thread:
//! 1. before and after each fetch of a shard ([`Engine::fetch_shard`](crate::Engine)), the
//!    engine walks the running program's calls from the current one on and asks for a read
//!    of each offloaded unit whose gather will find it not held, in order
//!    ([`ReadAhead::issue`]): a unit gathered, in flight or being fetched is held until its
//!    release, so one released and gathered again later (in backward) is read ahead for
//!    its second gather; a read is sent when the blocks already held plus its own stay
//!    within the budget, or when nothing is held (a shard larger than the budget is read
//!    alone); the walk stops at the first read that does not fit, and the reads wait for
//!    the next fetch to free a block (nothing is refused or waited for here);
//! 2. a read lends its block to the I/O thread ([`Arena::lend`]), which reads the unit's
//!    pieces into it and answers the reads in the order sent;
//! 3. the fetch of a unit takes the replies up to its own, copies the block into the
//!    all-gather's buffer with the arena's `write_at` (host or device memory alike) and
//!    frees it ([`ReadAhead::take`]); a unit without a read ahead (the budget was full, or a
//!    gather outside a program) has its read sent then ([`ReadAhead::read_now`]), after the
//!    other reads ahead are dropped if the budget has no room for it, and is taken the same
//!    way: every read of a gather runs on the I/O thread, through this arena;
//! 4. a write of a unit's shard (the update, an import) first drops any read ahead of that
//!    unit, waiting for it if it is out ([`ReadAhead::forget`]), so no read races a write of
//!    the same shard and none holds bytes older than the file; between programs, the update
//!    writes the shards in unit order, and once a unit's update has run the engine walks
//!    the first calls of the program that ran last, as in step 1, up to the first unit not
//!    updated yet ([`Engine::read_ahead_after_update`](crate::Engine)), so the next run's
//!    first gathers find reads sent after their shards' writes, during the rest of the
//!    update;
//! 5. at the end of a program, what was read and not used is dropped
//!    ([`ReadAhead::forget_all`]); the reads sent during the update live until the next
//!    program's end.
//!
//! Replies carry the read's span (`read params unit {u}`, on the trace's file lane, timed on
//! the I/O thread), kept until the engine's next fetch or the program's end moves them into
//! the trace.

use super::error::{Error, Result};
use super::planning::offload_plan::ParamFileLayout;
use super::trace::{Lane, Span};
use std::collections::VecDeque;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;
use zero_alloc::tier::{ChunkPool, TierFile};
use zero_alloc::{Arena, Handle, Lent};

/// A unit's shard to read into a lent block.
struct Job {
    unit: usize,
    buf: Lent<u8>,
}

/// The I/O thread's answer: the block back, the bytes read, the read's span, how it went.
struct Done {
    buf: Lent<u8>,
    bytes: u64,
    span: Span,
    result: zero_alloc::Result<()>,
}

/// A read ahead of `unit` into `block`: still with the I/O thread (`out`), or read.
#[derive(Debug)]
struct Ahead {
    unit: usize,
    block: Handle,
    out: bool,
}

/// The read-ahead of a rank's parameter file: its host arena, its I/O thread, and the reads
/// issued, oldest first.
#[derive(Debug)]
pub(crate) struct ReadAhead {
    arena: Arena,
    budget: usize,
    queue: VecDeque<Ahead>,
    jobs: Option<Sender<Job>>,
    done: Receiver<Done>,
    handle: Option<JoinHandle<()>>,
    /// Bytes of the thread's pool buffer, fixed at start-up.
    pub pool_bytes: u64,
    /// Bytes the thread has read since start-up, and the seconds it spent reading them.
    pub read_bytes: u64,
    pub read_seconds: f64,
    /// Spans of the reads answered, until the engine moves them into its trace.
    pub spans: Vec<Span>,
}

impl ReadAhead {
    /// Starts the thread over `tier` laid out as `layout`, with a pool of `chunk` bytes of
    /// its own, and blocks from `arena` (as large as the plan says) within `budget` bytes.
    pub fn start(
        tier: Arc<TierFile>,
        layout: ParamFileLayout,
        chunk: usize,
        (arena, budget): (Arena, usize),
    ) -> Result<Self> {
        let pool = ChunkPool::new(1, chunk)?;
        let pool_bytes = pool.bytes() as u64;
        let (jobs, job_rx) = channel::<Job>();
        let (done_tx, done) = channel();
        let handle = std::thread::Builder::new()
            .name("zero-params-io".into())
            .spawn(move || serve(&tier, &layout, pool, &job_rx, &done_tx))
            .map_err(|e| Error::Order(format!("the parameter file's I/O thread: {e}")))?;
        Ok(Self {
            arena,
            budget,
            queue: VecDeque::new(),
            jobs: Some(jobs),
            done,
            handle: Some(handle),
            pool_bytes,
            read_bytes: 0,
            read_seconds: 0.0,
            spans: Vec::new(),
        })
    }

    /// The host arena of the reads ahead (its statistics and peak).
    pub fn arena(&self) -> &Arena {
        &self.arena
    }

    /// `unit` has a read ahead, out or done.
    pub fn has(&self, unit: usize) -> bool {
        self.queue.iter().any(|a| a.unit == unit)
    }

    /// Step 1: sends a read of `unit`'s shard (`len` bytes) unless it has one; false when
    /// it does not fit the budget beside the blocks held (nothing is sent).
    pub fn issue(&mut self, unit: usize, len: usize) -> Result<bool> {
        if self.has(unit) {
            return Ok(true);
        }
        let held = self.arena.stats().allocated;
        let block = self.arena.config().block_size(len).unwrap_or(usize::MAX);
        if held > 0 && held.saturating_add(block) > self.budget {
            return Ok(false);
        }
        let h = match self.arena.alloc(len) {
            Ok(h) => h,
            // A hole too small beside the blocks held: the read waits for a free.
            Err(_) if held > 0 => return Ok(false),
            Err(e) => return Err(e.into()),
        };
        let buf = match self.arena.lend::<u8>(h) {
            Ok(buf) => buf,
            Err(e) => {
                self.arena.free(h)?;
                return Err(e.into());
            }
        };
        let sent = match &self.jobs {
            Some(jobs) => jobs.send(Job { unit, buf }).map_err(|unsent| unsent.0),
            None => Err(Job { unit, buf }),
        };
        if let Err(unsent) = sent {
            // The job comes back unsent: its block is taken back and freed, not left lent.
            self.arena.take_back(unsent.buf)?;
            self.arena.free(h)?;
            return Err(gone());
        }
        self.queue.push_back(Ahead {
            unit,
            block: h,
            out: true,
        });
        Ok(true)
    }

    /// Step 3 for a unit the walk has not read ahead (a gather outside a program, or a
    /// budget full): sends its read now, after dropping every other read ahead when the
    /// budget has no room beside them (nothing held, any shard fits: the arena is planned
    /// for the largest).
    pub fn read_now(&mut self, unit: usize, len: usize) -> Result<()> {
        if self.issue(unit, len)? {
            return Ok(());
        }
        self.forget_all()?;
        match self.issue(unit, len)? {
            true => Ok(()),
            false => Err(Error::Order(format!(
                "unit {unit}'s read ({len} bytes) found no room with no read ahead held"
            ))),
        }
    }

    /// Step 3: hands `unit`'s shard (its first `len` bytes), read ahead, to `put` (which
    /// copies it where the gather wants it) and frees its block; false (`put` not called)
    /// when `unit` has no read ahead.
    pub fn take(
        &mut self,
        unit: usize,
        len: usize,
        put: impl FnOnce(&[u8]) -> Result<()>,
    ) -> Result<bool> {
        let Some(at) = self.wait_for(unit)? else {
            return Ok(false);
        };
        let ahead = self.queue.remove(at).ok_or_else(gone)?;
        let copied = self
            .arena
            .slice::<u8>(ahead.block)
            .map_err(Error::from)
            .and_then(|bytes| put(bytes.get(..len).ok_or_else(|| short(unit, len))?));
        let freed = self.arena.free(ahead.block).map_err(Error::from);
        copied.and(freed).map(|()| true)
    }

    /// Step 4: drops `unit`'s read ahead, if any, once the thread has answered it.
    pub fn forget(&mut self, unit: usize) -> Result<()> {
        if let Some(at) = self.wait_for(unit)? {
            if let Some(ahead) = self.queue.remove(at) {
                self.arena.free(ahead.block)?;
            }
        }
        Ok(())
    }

    /// Step 5: drops every read ahead, waiting for those out; the first error.
    pub fn forget_all(&mut self) -> Result<()> {
        let mut first = Ok(());
        // Each pass drops the oldest read (a failed one is dropped as its reply comes).
        for _ in 0..self.queue.len() {
            let Some(unit) = self.queue.front().map(|a| a.unit) else {
                break;
            };
            first = first.and(self.forget(unit));
        }
        first
    }

    /// The position of `unit`'s read ahead once answered (taking replies up to it), or
    /// `None` when it has none.
    fn wait_for(&mut self, unit: usize) -> Result<Option<usize>> {
        loop {
            match self.queue.iter().position(|a| a.unit == unit) {
                None => return Ok(None),
                Some(at) if !self.queue[at].out => return Ok(Some(at)),
                Some(_) => self.receive()?,
            }
        }
    }

    /// Takes the next reply's block back (the oldest read out), counting what it read and
    /// keeping its span; a read that failed is dropped, its block freed, and its error
    /// returned.
    fn receive(&mut self) -> Result<()> {
        let Some(at) = self.queue.iter().position(|a| a.out) else {
            return Err(Error::Order("a reply awaited with no read out".into()));
        };
        let Ok(reply) = self.done.recv() else {
            // A thread gone (it panicked) answers nothing more: its blocks stay lent.
            self.queue.retain(|a| !a.out);
            return Err(gone());
        };
        self.read_bytes += reply.bytes;
        self.read_seconds += (reply.span.end - reply.span.start).as_secs_f64();
        self.spans.push(reply.span);
        let block = self.arena.take_back(reply.buf)?;
        if let Err(e) = reply.result {
            self.queue.remove(at);
            self.arena.free(block)?;
            return Err(e.into());
        }
        self.queue[at].out = false;
        Ok(())
    }
}

impl Drop for ReadAhead {
    fn drop(&mut self) {
        // Closing the job channel ends the thread's loop; what it still answers is dropped.
        self.jobs.take();
        if let Some(handle) = self.handle.take() {
            // A thread that panicked has nothing left to clean up.
            let _ = handle.join();
        }
    }
}

/// The thread's loop: reads each job's unit into its block, answering in order, until the
/// job channel closes or no one takes the replies.
fn serve(
    tier: &TierFile,
    layout: &ParamFileLayout,
    mut pool: ChunkPool,
    jobs: &Receiver<Job>,
    done: &Sender<Done>,
) {
    for mut job in jobs {
        let start = Instant::now();
        let mut bytes = 0u64;
        let result = (|| {
            let buf = job.buf.as_mut();
            for index in layout.pieces(job.unit) {
                let len = layout.lens[index] as usize;
                let at = bytes as usize;
                let dst =
                    buf.get_mut(at..at + len)
                        .ok_or(zero_alloc::AllocError::InvalidConfig {
                            reason: format!("unit {}'s read-ahead block is short", job.unit),
                        })?;
                tier.read_piece(index, dst, &mut pool)?;
                bytes += len as u64;
            }
            Ok(())
        })();
        let span = Span {
            name: format!("read params unit {}", job.unit),
            lane: Lane::File,
            start,
            end: Instant::now(),
            bytes: Some(bytes),
        };
        let reply = Done {
            buf: job.buf,
            bytes,
            span,
            result,
        };
        if done.send(reply).is_err() {
            break;
        }
    }
}

fn gone() -> Error {
    Error::Order("the parameter file's I/O thread is gone".into())
}

fn short(unit: usize, len: usize) -> Error {
    Error::BadSpan {
        kernel: "parameter read-ahead",
        message: format!("unit {unit}'s read-ahead block is shorter than {len} bytes"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::optimizer_file::create_tier;
    use crate::planning::plan::read_ahead_arena_config;

    const PIECE: usize = 4096;

    /// Three units of one piece each, unit u's bytes all `u + 1`, read ahead within two
    /// pieces' blocks.
    fn three_units(dir: &std::path::Path) -> ReadAhead {
        let layout = ParamFileLayout {
            lens: vec![PIECE as u64; 3],
            first: vec![0, 1, 2],
            piece_bytes: PIECE,
        };
        let tier = create_tier(dir, (0, 1), "params", &layout.lens).unwrap();
        let mut pool = ChunkPool::new(1, PIECE).unwrap();
        for u in 0..3u8 {
            let bytes = vec![u + 1; PIECE];
            tier.write_piece(usize::from(u), &bytes, &mut pool).unwrap();
        }
        let arena = Arena::new(read_ahead_arena_config(2 * PIECE)).unwrap();
        ReadAhead::start(Arc::new(tier), layout, PIECE, (arena, 2 * PIECE)).unwrap()
    }

    /// `unit`'s shard as a gather receives it.
    fn taken(ahead: &mut ReadAhead, unit: usize) -> Vec<u8> {
        let mut out = Vec::new();
        let put = |src: &[u8]| {
            out.extend_from_slice(src);
            Ok(())
        };
        assert!(
            ahead.take(unit, PIECE, put).unwrap(),
            "unit {unit} was not read"
        );
        out
    }

    #[test]
    fn a_read_sent_by_its_fetch_drops_the_reads_ahead_only_when_the_budget_is_full() {
        let dir = std::env::temp_dir().join(format!("zero-read-now-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut ahead = three_units(&dir);
        assert!(ahead.issue(1, PIECE).unwrap() && ahead.issue(2, PIECE).unwrap());
        assert!(
            !ahead.issue(0, PIECE).unwrap(),
            "a third block past the budget"
        );
        ahead.read_now(0, PIECE).unwrap();
        assert!(
            !ahead.has(1) && !ahead.has(2),
            "the full budget's reads stayed"
        );
        assert_eq!(taken(&mut ahead, 0), vec![1u8; PIECE]);
        assert_eq!(ahead.arena().stats().allocated, 0, "a block left held");
        assert!(ahead.issue(2, PIECE).unwrap());
        ahead.read_now(1, PIECE).unwrap();
        assert!(
            ahead.has(2),
            "a read ahead dropped while the budget had room"
        );
        assert_eq!(taken(&mut ahead, 1), vec![2u8; PIECE]);
        assert_eq!(taken(&mut ahead, 2), vec![3u8; PIECE]);
        assert_eq!(
            ahead.read_bytes,
            5 * PIECE as u64,
            "reads of units 1, 2, 0, 2 and 1"
        );
        drop(ahead);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
