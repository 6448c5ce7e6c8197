//! Asynchronous copies between arena blocks and pinned host buffers.
//!
//! A [`CopyEngine`] owns one copy thread (on CUDA arenas the thread drives a dedicated copy
//! stream). A submitted copy pins its block, so the block is neither moved, freed nor viewed
//! until [`Transfer::wait`] unpins it; the job itself owns the host buffer and a reference to
//! the arena's memory, so dropping a `Transfer` or the arena early cannot free memory under
//! the copy. [`offload_double_buffered`] streams a large block through two buffers so the
//! caller computes on one chunk while the next is in flight.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Instant;

use crate::error::{AllocError, Result};
use crate::storage::Storage;
use crate::{Arena, Handle, PinnedBuffer};

/// The arena side of a copy, kept alive by the job.
enum Side {
    Host(Arc<crate::memory::HostRegion>),
    #[cfg(feature = "cuda")]
    Device(Arc<crate::cuda::DeviceRegion>),
}

struct Job {
    side: Side,
    offset: usize,
    len: usize,
    to_host: bool,
    buffer: PinnedBuffer,
    done: Arc<Completion>,
}

impl Job {
    fn run(mut self) {
        let started = Instant::now();
        let host = self.buffer.as_bytes_mut().as_mut_ptr();
        let result = match &self.side {
            Side::Host(region) => {
                // SAFETY: `offset + len` lies inside the region (checked at submission); the
                // block is pinned, so nothing else reads or writes it until the submitter
                // waits; `host` points to `len` bytes of the buffer this job owns.
                unsafe {
                    let block = region.base().add(self.offset);
                    if self.to_host {
                        std::ptr::copy_nonoverlapping(block, host, self.len);
                    } else {
                        std::ptr::copy_nonoverlapping(host, block, self.len);
                    }
                }
                Ok(())
            }
            #[cfg(feature = "cuda")]
            Side::Device(region) => {
                region.copy_on_copy_stream(self.offset, host, self.len, self.to_host)
            }
        };
        let timing = CopyTiming {
            started,
            finished: Instant::now(),
            bytes: self.len,
            to_host: self.to_host,
        };
        self.done.finish(result.map(|()| (self.buffer, timing)));
    }
}

/// When a finished copy ran on the copy thread, and what it moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyTiming {
    /// The copy thread started it.
    pub started: Instant,
    /// It finished (on a CUDA arena: its copy stream was synchronized).
    pub finished: Instant,
    /// Bytes copied.
    pub bytes: usize,
    /// From the arena to the host buffer (else the reverse).
    pub to_host: bool,
}

/// Where a finished job leaves its buffer for the waiter.
#[derive(Default)]
struct Completion {
    slot: Mutex<Option<Result<(PinnedBuffer, CopyTiming)>>>,
    ready: Condvar,
}

impl Completion {
    fn finish(&self, result: Result<(PinnedBuffer, CopyTiming)>) {
        *self.slot.lock().unwrap_or_else(PoisonError::into_inner) = Some(result);
        self.ready.notify_all();
    }

    fn is_done(&self) -> bool {
        self.slot
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
    }

    fn take(&self) -> Result<(PinnedBuffer, CopyTiming)> {
        let mut slot = self.slot.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if let Some(result) = slot.take() {
                return result;
            }
            slot = self
                .ready
                .wait(slot)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}

/// A copy thread that runs [`Transfer`]s in submission order.
///
/// # Examples
///
/// ```
/// use zero_alloc::{Arena, CopyEngine, PinnedBuffer};
///
/// let engine = CopyEngine::new()?;
/// let mut arena = Arena::host(1 << 20)?;
/// let moments = arena.alloc_elems::<f32>(1024)?; // (1024,)
/// arena.slice_mut::<f32>(moments)?.fill(0.5);
/// let transfer = engine.to_host(&mut arena, moments, 0..4096, PinnedBuffer::new(4096)?)?;
/// // ... compute on other blocks while the copy runs ...
/// let host = transfer.wait(&mut arena)?; // unpins `moments`
/// assert_eq!(host.as_slice::<f32>()?[1023], 0.5);
/// # Ok::<(), zero_alloc::AllocError>(())
/// ```
#[derive(Debug)]
pub struct CopyEngine {
    jobs: Option<Sender<Job>>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("offset", &self.offset)
            .field("len", &self.len)
            .finish()
    }
}

impl CopyEngine {
    /// Starts the copy thread.
    ///
    /// # Errors
    ///
    /// [`AllocError::Os`] when the thread cannot be spawned.
    pub fn new() -> Result<Self> {
        let (tx, rx) = mpsc::channel::<Job>();
        let thread = std::thread::Builder::new()
            .name("zero-alloc-copy".into())
            .spawn(move || rx.into_iter().for_each(Job::run))
            .map_err(|source| AllocError::Os {
                what: "spawn copy thread",
                bytes: 0,
                source,
            })?;
        Ok(Self {
            jobs: Some(tx),
            thread: Some(thread),
        })
    }

    /// Copies the byte `range` of block `handle` into the start of `buffer`.
    ///
    /// # Errors
    ///
    /// [`AllocError::LengthMismatch`] when the range passes the block's end or the buffer's,
    /// [`AllocError::NoHostMemory`] for accounting arenas, stale or foreign handles,
    /// [`AllocError::CopyEngineGone`].
    pub fn to_host(
        &self,
        arena: &mut Arena,
        handle: Handle,
        range: Range<usize>,
        buffer: PinnedBuffer,
    ) -> Result<Transfer> {
        self.submit(arena, handle, range, buffer, true)
    }

    /// Copies the start of `buffer` into the byte `range` of block `handle`.
    ///
    /// # Errors
    ///
    /// As [`to_host`](Self::to_host).
    pub fn to_arena(
        &self,
        arena: &mut Arena,
        buffer: PinnedBuffer,
        handle: Handle,
        range: Range<usize>,
    ) -> Result<Transfer> {
        self.submit(arena, handle, range, buffer, false)
    }

    fn submit(
        &self,
        arena: &mut Arena,
        handle: Handle,
        range: Range<usize>,
        buffer: PinnedBuffer,
        to_host: bool,
    ) -> Result<Transfer> {
        let block = arena.block(handle)?;
        let len = range.end.saturating_sub(range.start);
        if range.start > range.end || range.end > block.len || len > buffer.len() {
            return Err(AllocError::LengthMismatch {
                src: len,
                dst: buffer.len(),
            });
        }
        let at = range.start;
        let side = match &arena.storage {
            Storage::Host(region) => Side::Host(Arc::clone(region)),
            #[cfg(feature = "cuda")]
            Storage::Cuda(region) => Side::Device(Arc::clone(region)),
            Storage::None => {
                return Err(AllocError::NoHostMemory {
                    device: arena.device(),
                    reason: "accounting mode",
                })
            }
        };
        let jobs = self.jobs.as_ref().ok_or(AllocError::CopyEngineGone)?;
        arena.pin(handle)?;
        let done = Arc::new(Completion::default());
        let job = Job {
            side,
            offset: block.offset + at,
            len,
            to_host,
            buffer,
            done: Arc::clone(&done),
        };
        if jobs.send(job).is_err() {
            arena.unpin(handle)?;
            return Err(AllocError::CopyEngineGone);
        }
        Ok(Transfer { handle, done })
    }
}

impl Drop for CopyEngine {
    fn drop(&mut self) {
        // Closing the channel lets the thread drain queued jobs and exit.
        drop(self.jobs.take());
        if let Some(thread) = self.thread.take() {
            // A panicked copy thread has already failed its jobs' waiters; nothing to report.
            let _ = thread.join();
        }
    }
}

/// A copy in flight. Dropping it without [`wait`](Self::wait) leaves the block pinned (safe,
/// but the block can then never be freed or moved).
#[must_use = "wait() unpins the block and returns the buffer"]
#[derive(Debug)]
pub struct Transfer {
    handle: Handle,
    done: Arc<Completion>,
}

impl std::fmt::Debug for Completion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Completion")
            .field("done", &self.is_done())
            .finish()
    }
}

impl Transfer {
    /// True once the copy has finished (successfully or not).
    #[must_use]
    pub fn is_done(&self) -> bool {
        self.done.is_done()
    }

    /// The block being copied.
    #[must_use]
    pub fn handle(&self) -> Handle {
        self.handle
    }

    /// Blocks until the copy finishes, unpins the block and returns the buffer.
    ///
    /// # Errors
    ///
    /// The copy's own error (CUDA), or a foreign handle when `arena` is not the arena the
    /// copy was submitted on (the copy is still waited for).
    pub fn wait(self, arena: &mut Arena) -> Result<PinnedBuffer> {
        Ok(self.wait_timed(arena)?.0)
    }

    /// As [`wait`](Self::wait), with when the copy ran.
    ///
    /// # Errors
    ///
    /// As [`wait`](Self::wait).
    pub fn wait_timed(self, arena: &mut Arena) -> Result<(PinnedBuffer, CopyTiming)> {
        let result = self.done.take();
        arena.unpin(self.handle)?;
        result
    }
}

/// What the consumer of [`offload_double_buffered`] is handed with each chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunk {
    /// Chunk number, from 0.
    pub index: usize,
    /// Byte offset of the chunk in the block.
    pub offset: usize,
    /// Copies still in flight while this chunk is consumed (1 except for the last chunk):
    /// the overlap of transfer and compute.
    pub in_flight: usize,
}

/// Streams block `handle` to the host through two buffers of equal size: while `consume`
/// works on chunk k, chunk k + 1 is being copied. Returns the buffers.
///
/// # Errors
///
/// [`AllocError::LengthMismatch`] when the buffers are empty or differ in size; copy errors;
/// the first error `consume` returns. Copies already queued are waited for (so the block is
/// unpinned) before any error is returned; buffers of a failed call are dropped.
pub fn offload_double_buffered<F>(
    engine: &CopyEngine,
    arena: &mut Arena,
    handle: Handle,
    buffers: [PinnedBuffer; 2],
    mut consume: F,
) -> Result<[PinnedBuffer; 2]>
where
    F: FnMut(Chunk, &[u8]) -> Result<()>,
{
    let [a, b] = buffers;
    let chunk = a.len();
    if chunk == 0 || b.len() != chunk {
        return Err(AllocError::LengthMismatch {
            src: a.len(),
            dst: b.len(),
        });
    }
    let total = arena.block(handle)?.len;
    let chunks = total.div_ceil(chunk);
    let mut spare = vec![b, a]; // popped from the back: `a` carries chunk 0
    let mut queue = VecDeque::new();
    let mut submitted = 0;
    let mut result = Ok(());
    for index in 0..chunks {
        while result.is_ok() && submitted < chunks && queue.len() < 2 {
            let Some(buf) = spare.pop() else { break };
            let start = submitted * chunk;
            let range = start..(start + chunk).min(total);
            match engine.to_host(arena, handle, range.clone(), buf) {
                Ok(transfer) => queue.push_back((transfer, range)),
                Err(err) => result = Err(err),
            }
            submitted += 1;
        }
        let Some((transfer, range)) = queue.pop_front() else {
            break;
        };
        match transfer.wait(arena) {
            Ok(buf) => {
                if result.is_ok() {
                    let info = Chunk {
                        index,
                        offset: range.start,
                        in_flight: queue.len(),
                    };
                    result = consume(info, &buf.as_bytes()[..range.len()]);
                }
                spare.push(buf);
            }
            Err(err) => result = result.and(Err(err)),
        }
    }
    result?;
    <[PinnedBuffer; 2]>::try_from(spare).map_err(|_| AllocError::CopyEngineGone)
}
