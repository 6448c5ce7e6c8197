//! The user-facing [`Communicator`]: rank, size and the blocking collectives.

use std::cell::{Cell, RefCell};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use crate::backend::{Backend, Leave};
use crate::config::Config;
use crate::element::Element;
use crate::error::{CommError, Result};
use crate::fault;
use crate::op::{OpDesc, OpKind};
use crate::record::{History, Recorder, Stats};
use crate::reduce_op::ReduceOp;
use crate::work::Progress;

/// A collective call, for code that picks the operation at run time (benchmarks, bucketers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Collective {
    /// See [`Communicator::all_reduce`].
    AllReduce(ReduceOp),
    /// See [`Communicator::reduce_scatter`].
    ReduceScatter(ReduceOp),
    /// See [`Communicator::all_gather`].
    AllGather,
    /// See [`Communicator::broadcast`]; the root.
    Broadcast(usize),
    /// See [`Communicator::reduce`]; the reduction and the root.
    Reduce(ReduceOp, usize),
}

impl Collective {
    /// The kind of operation.
    pub fn kind(self) -> OpKind {
        match self {
            Collective::AllReduce(_) => OpKind::AllReduce,
            Collective::ReduceScatter(_) => OpKind::ReduceScatter,
            Collective::AllGather => OpKind::AllGather,
            Collective::Broadcast(_) => OpKind::Broadcast,
            Collective::Reduce(..) => OpKind::Reduce,
        }
    }

    /// [`CommError::UnsupportedReduction`] when the call reduces and its reduction is not
    /// defined on `dtype` (avg on integers).
    pub(crate) fn check_reduction(self, dtype: crate::DType) -> Result<()> {
        match self {
            Collective::AllReduce(op)
            | Collective::ReduceScatter(op)
            | Collective::Reduce(op, _) => op.check(self.kind(), dtype),
            Collective::AllGather | Collective::Broadcast(_) => Ok(()),
        }
    }
}

/// The state an operation needs, shared by the caller's thread and the progress thread.
#[derive(Debug)]
pub(crate) struct Inner {
    pub backend: Box<dyn Backend>,
    pub seq: u64,
    pub recorder: Arc<Mutex<Recorder>>,
    /// Faults injected on purpose, waiting for their collectives ([`crate::fault`]).
    pub faults: Vec<crate::fault::Armed>,
    /// [`Config::checksums`].
    pub checksums: bool,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Operations leave `Inner` consistent at every await point (the sequence number is
    // bumped before the backend runs), so a panic elsewhere does not invalidate it.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One rank's handle on a group: every collective of the group goes through it.
///
/// A communicator is `Send` but not `Sync`: one thread issues its operations, which is what
/// makes "operations complete in issue order" well defined. Blocking calls first wait for the
/// non-blocking ones issued before them, then run on the caller's thread.
///
/// Dropping it (including while the thread unwinds from a panic) marks the rank gone: peers'
/// pending and later collectives on the group fail with [`CommError::Broken`].
#[derive(Debug)]
pub struct Communicator {
    pub(crate) inner: Arc<Mutex<Inner>>,
    pub(crate) recorder: Arc<Mutex<Recorder>>,
    pub(crate) progress: RefCell<Option<Progress>>,
    pub(crate) issued: Cell<u64>,
    rank: usize,
    size: usize,
    backend_name: &'static str,
    config: Config,
    pub(crate) leave: Arc<dyn Leave>,
}

impl Communicator {
    /// Wraps a backend endpoint. Backends' constructors (e.g. [`crate::local::create`]) call this.
    pub fn new(backend: Box<dyn Backend>, config: Config) -> Self {
        let (rank, size, backend_name) = (backend.rank(), backend.size(), backend.name());
        let leave = backend.leave_handle();
        let recorder = Arc::new(Mutex::new(Recorder::new(rank, config.history_len)));
        let inner = Inner {
            backend,
            seq: 0,
            recorder: Arc::clone(&recorder),
            faults: Vec::new(),
            checksums: config.checksums,
        };
        Communicator {
            inner: Arc::new(Mutex::new(inner)),
            recorder,
            progress: RefCell::new(None),
            issued: Cell::new(0),
            rank,
            size,
            backend_name,
            config,
            leave,
        }
    }

    /// This rank, in `0..size()`.
    pub fn rank(&self) -> usize {
        self.rank
    }
    /// Number of ranks in the group.
    pub fn size(&self) -> usize {
        self.size
    }
    /// The backend's name (`local`, ...).
    pub fn backend(&self) -> &'static str {
        self.backend_name
    }
    /// The group's settings.
    pub fn config(&self) -> Config {
        self.config
    }
    /// Counters since creation.
    pub fn stats(&self) -> Stats {
        lock(&self.recorder).stats
    }
    /// The last operations, oldest first.
    pub fn history(&self) -> History {
        lock(&self.recorder).history.clone()
    }

    /// Runs `f` on the caller's thread after every earlier non-blocking operation finished.
    fn blocking<R>(&self, f: impl FnOnce(&mut Inner) -> Result<R>) -> Result<R> {
        self.drain();
        f(&mut lock(&self.inner))
    }

    /// Runs `call` with `send` (`None`: in place) into `recv`. The named methods below are
    /// this with a fixed `call`.
    ///
    /// # Errors
    /// See [`CommError`]: wrong lengths or root, avg on integers, timeouts, a broken group, a
    /// mismatch.
    pub fn collective<T: Element>(
        &self,
        call: Collective,
        send: Option<&[T]>,
        recv: &mut [T],
    ) -> Result<()> {
        self.blocking(|inner| run_call(inner, call, send, recv))
    }

    /// Out-of-place all-reduce: `recv = op(send of every rank)`; equal lengths.
    ///
    /// # Errors
    /// As [`Communicator::collective`].
    pub fn all_reduce<T: Element>(&self, send: &[T], recv: &mut [T], op: ReduceOp) -> Result<()> {
        self.collective(Collective::AllReduce(op), Some(send), recv)
    }
    /// In-place all-reduce.
    ///
    /// # Errors
    /// As [`Communicator::collective`].
    pub fn all_reduce_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        self.collective(Collective::AllReduce(op), None, buf)
    }
    /// Out-of-place reduce-scatter: `send` has `size() * recv.len()` elements; rank r gets
    /// chunk r of the reduction.
    ///
    /// # Errors
    /// As [`Communicator::collective`].
    pub fn reduce_scatter<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        self.collective(Collective::ReduceScatter(op), Some(send), recv)
    }
    /// In-place reduce-scatter: `buf.len()` is a multiple of `size()`; rank r's result is
    /// chunk r of `buf` (the rest is left as it was).
    ///
    /// # Errors
    /// As [`Communicator::collective`].
    pub fn reduce_scatter_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        self.collective(Collective::ReduceScatter(op), None, buf)
    }
    /// Out-of-place all-gather: `recv` has `size() * send.len()` elements, chunk j from rank j.
    ///
    /// # Errors
    /// As [`Communicator::collective`].
    pub fn all_gather<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        self.collective(Collective::AllGather, Some(send), recv)
    }
    /// In-place all-gather: rank r's input is chunk r of `buf`.
    ///
    /// # Errors
    /// As [`Communicator::collective`].
    pub fn all_gather_in_place<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        self.collective(Collective::AllGather, None, buf)
    }
    /// Out-of-place broadcast: every `recv` gets the root's `send` (ignored elsewhere).
    ///
    /// # Errors
    /// As [`Communicator::collective`].
    pub fn broadcast<T: Element>(&self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        self.collective(Collective::Broadcast(root), Some(send), recv)
    }
    /// In-place broadcast of the root's `buf`.
    ///
    /// # Errors
    /// As [`Communicator::collective`].
    pub fn broadcast_in_place<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        self.collective(Collective::Broadcast(root), None, buf)
    }
    /// Out-of-place reduce: the root's `recv` gets `op(send of every rank)`; `recv` is ignored
    /// (and may be empty) elsewhere.
    ///
    /// # Errors
    /// As [`Communicator::collective`].
    pub fn reduce<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        self.collective(Collective::Reduce(op, root), Some(send), recv)
    }
    /// In-place reduce into the root's `buf`; other ranks' buffers are inputs only.
    ///
    /// # Errors
    /// As [`Communicator::collective`].
    pub fn reduce_in_place<T: Element>(
        &self,
        buf: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        self.collective(Collective::Reduce(op, root), None, buf)
    }

    /// Returns once every rank has called it.
    ///
    /// # Errors
    /// Timeouts and broken groups.
    pub fn barrier(&self) -> Result<()> {
        self.blocking(run_barrier)
    }

    /// Splits the group: ranks passing the same `color` form a new communicator, ranked by
    /// (`key`, old rank). Every rank of the group must call it.
    ///
    /// A 2-D grid of `dp x tp` ranks: `split(rank / tp, rank % tp)` gives the tensor-parallel
    /// group, `split(rank % tp, rank / tp)` the data-parallel one.
    ///
    /// # Errors
    /// Timeouts, broken groups and mismatches.
    pub fn split(&self, color: u32, key: u32) -> Result<Communicator> {
        let config = self.config;
        self.blocking(|inner| {
            let desc = next_desc(inner, OpKind::Split, None, 0, None, None);
            let backend = execute(inner, &desc, |b| b.split(&desc, color, key))?;
            Ok(Communicator::new(backend, config))
        })
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        let panicking = std::thread::panicking();
        if panicking {
            // Fail peers fast; our queued operations then fail fast too.
            self.leave.leave(true);
        }
        if let Some(progress) = self.progress.get_mut().take() {
            progress.shut_down();
        }
        if !panicking {
            self.leave.leave(false);
        }
    }
}

pub(crate) fn next_desc(
    inner: &mut Inner,
    kind: OpKind,
    dtype: Option<crate::DType>,
    count: usize,
    root: Option<usize>,
    op: Option<ReduceOp>,
) -> OpDesc {
    let desc = OpDesc {
        seq: inner.seq,
        kind,
        dtype,
        count,
        root,
        op,
    };
    inner.seq += 1;
    desc
}

/// Runs `f` on the backend, recording counters and history, and attaching the history to
/// any error.
pub(crate) fn execute<R>(
    inner: &mut Inner,
    desc: &OpDesc,
    f: impl FnOnce(&mut dyn Backend) -> Result<R>,
) -> Result<R> {
    let (size, rank) = (inner.backend.size(), inner.backend.rank());
    let start = Instant::now();
    let result =
        fault::before_op(&mut inner.faults, rank, desc).and_then(|()| f(&mut *inner.backend));
    let elapsed = start.elapsed();
    let mut rec = lock(&inner.recorder);
    rec.record(desc, size, elapsed, result.is_ok());
    result.map_err(|e| e.with_history(&rec.history))
}

pub(crate) fn run_barrier(inner: &mut Inner) -> Result<()> {
    let desc = next_desc(inner, OpKind::Barrier, None, 0, None, None);
    execute(inner, &desc, |b| b.barrier(&desc))
}

/// [`CommError::Length`] unless a buffer holds the `expected` number of elements.
pub(crate) fn length(op: OpKind, what: &'static str, expected: usize, got: usize) -> Result<()> {
    if expected == got {
        Ok(())
    } else {
        Err(CommError::Length {
            op,
            what,
            expected,
            got,
        })
    }
}

/// Checks this rank's buffers and returns the count of the whole array.
fn count_of<T>(
    call: Collective,
    size: usize,
    rank: usize,
    send: Option<&[T]>,
    recv: &[T],
) -> Result<usize> {
    let kind = call.kind();
    let multiple = |len: usize| {
        if len % size == 0 {
            Ok(len)
        } else {
            Err(CommError::Length {
                op: kind,
                what: "array (not a multiple of the group size)",
                expected: len.div_ceil(size) * size,
                got: len,
            })
        }
    };
    match (call, send) {
        (Collective::AllReduce(_), Some(s)) => {
            length(kind, "recv", s.len(), recv.len()).map(|()| s.len())
        }
        (Collective::ReduceScatter(_), Some(s)) => {
            length(kind, "send", recv.len() * size, s.len()).map(|()| s.len())
        }
        (Collective::AllGather, Some(s)) => {
            length(kind, "recv", s.len() * size, recv.len()).map(|()| recv.len())
        }
        (Collective::ReduceScatter(_) | Collective::AllGather, None) => multiple(recv.len()),
        (Collective::Broadcast(root), Some(s)) if root == rank => {
            length(kind, "send", recv.len(), s.len()).map(|()| recv.len())
        }
        (Collective::Reduce(_, root), Some(s)) if root == rank => {
            length(kind, "recv", s.len(), recv.len()).map(|()| s.len())
        }
        (Collective::Reduce(..), Some(s)) => Ok(s.len()),
        _ => Ok(recv.len()),
    }
}

/// Validates and runs one data collective; then fires an armed `Corrupt` fault and, with
/// [`Config::checksums`], compares the result's hash across ranks ([`crate::fault`]).
pub(crate) fn run_call<T: Element>(
    inner: &mut Inner,
    call: Collective,
    send: Option<&[T]>,
    recv: &mut [T],
) -> Result<()> {
    let desc = run_unchecked(inner, call, send, recv)?;
    let result: &mut [T] = match call {
        Collective::Reduce(_, r) if r != inner.backend.rank() && send.is_some() => &mut [],
        _ => recv,
    };
    fault::corrupt_result(&mut inner.faults, &desc, result);
    if inner.checksums && fault::replicated_result(desc.kind) {
        fault::check_result(inner, &desc, result)?;
    }
    Ok(())
}

/// Validates and runs one data collective; returns its descriptor.
pub(crate) fn run_unchecked<T: Element>(
    inner: &mut Inner,
    call: Collective,
    send: Option<&[T]>,
    recv: &mut [T],
) -> Result<OpDesc> {
    let (size, rank) = (inner.backend.size(), inner.backend.rank());
    let count = count_of(call, size, rank, send, recv)?;
    let (op, root) = match call {
        Collective::AllReduce(op) | Collective::ReduceScatter(op) => (Some(op), None),
        Collective::AllGather => (None, None),
        Collective::Broadcast(root) => (None, Some(root)),
        Collective::Reduce(op, root) => (Some(op), Some(root)),
    };
    call.check_reduction(T::DTYPE)?;
    if let Some(root) = root.filter(|&r| r >= size) {
        return Err(CommError::Root {
            op: call.kind(),
            root,
            size,
        });
    }
    // The local backend indexes peers' buffers by the agreed count; a non-root's ignored
    // buffer must not be handed over with a shorter length than it claims.
    let recv_used: &mut [T] = match call {
        Collective::Reduce(_, r) if r != rank && send.is_some() => &mut [],
        _ => recv,
    };
    let send_used: Option<&[T]> = match call {
        Collective::Broadcast(r) if r != rank => send.map(|_| &[][..]),
        _ => send,
    };
    let desc = next_desc(inner, call.kind(), Some(T::DTYPE), count, root, op);
    let s = send_used.map(T::buf_ref);
    let r = T::buf_mut(recv_used);
    execute(inner, &desc, |b| match call {
        Collective::AllReduce(op) => b.all_reduce(&desc, s, r, op),
        Collective::ReduceScatter(op) => b.reduce_scatter(&desc, s, r, op),
        Collective::AllGather => b.all_gather(&desc, s, r),
        Collective::Broadcast(root) => b.broadcast(&desc, s, r, root),
        Collective::Reduce(op, root) => b.reduce(&desc, s, r, op, root),
    })?;
    Ok(desc)
}
