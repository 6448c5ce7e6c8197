//! Non-blocking collectives: work handles and the progress thread.
//!
//! Decision: a non-blocking call takes its buffers *by value* (anything that is
//! `AsRef<[T]>`/`AsMut<[T]>` + `Send + 'static`: `Vec<T>`, `Box<[T]>`, an owned arena buffer)
//! and [`Work::wait`] hands them back. The progress thread owns them while the operation
//! runs, so forgetting or dropping the handle can never leave a peer writing into freed or
//! re-borrowed memory. Rejected: free-standing handles that borrow `&mut [T]`, unsound under
//! `mem::forget`. Borrowed buffers (arena views) go through [`Communicator::scope`] instead,
//! which waits for its operations before returning, as `std::thread::scope` does.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use crate::communicator::{lock, run_barrier, run_call, Collective, Communicator, Inner};
use crate::element::Element;
use crate::error::{CommError, Result};
use crate::op::OpKind;
use crate::reduce_op::ReduceOp;

type Job = Box<dyn FnOnce() + Send>;

/// A communicator's progress thread: runs queued operations one at a time, in issue order.
#[derive(Debug)]
pub(crate) struct Progress {
    tx: mpsc::Sender<Job>,
    thread: JoinHandle<()>,
    completed: Arc<(Mutex<u64>, Condvar)>,
}

impl Progress {
    fn start(rank: usize) -> std::io::Result<Progress> {
        let (tx, rx) = mpsc::channel::<Job>();
        let completed = Arc::new((Mutex::new(0u64), Condvar::new()));
        let done = Arc::clone(&completed);
        let thread = std::thread::Builder::new()
            .name(format!("zero-comm-progress-{rank}"))
            .spawn(move || {
                for job in rx {
                    // A panicking job (a user's `AsMut` impl, say) fails its own handle via
                    // `Completer::drop`; the thread lives on so later jobs and `drain` proceed.
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                    *lock(&done.0) += 1;
                    done.1.notify_all();
                }
            })?;
        Ok(Progress {
            tx,
            thread,
            completed,
        })
    }

    /// Finishes the queued operations and joins the thread.
    pub(crate) fn shut_down(self) {
        drop(self.tx);
        // A job that panicked already failed its handle (see `Completer`); nothing to report.
        let _ = self.thread.join();
    }
}

struct Cell<R> {
    value: Mutex<Option<Result<R>>>,
    cv: Condvar,
    done: AtomicBool,
}

/// The handle of a non-blocking collective.
///
/// Dropping it does not cancel the operation (peers are counting on it); the buffers are
/// then freed when it completes.
#[must_use = "a non-blocking collective's buffers and errors come back from wait()"]
pub struct Work<R> {
    cell: Arc<Cell<R>>,
}

impl<R> std::fmt::Debug for Work<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Work")
            .field("done", &self.is_done())
            .finish()
    }
}

impl<R> Work<R> {
    /// True once the operation finished (successfully or not); `wait` then returns at once.
    pub fn is_done(&self) -> bool {
        self.cell.done.load(Ordering::Acquire)
    }

    /// Blocks until the operation finished and returns its buffers.
    ///
    /// It cannot block forever: the operation itself fails after the group's timeout.
    ///
    /// # Errors
    /// The operation's error.
    pub fn wait(self) -> Result<R> {
        let mut value = lock(&self.cell.value);
        loop {
            if let Some(v) = value.take() {
                return v;
            }
            value = self
                .cell
                .cv
                .wait(value)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }
}

/// The progress thread's side of a [`Work`]; if dropped unfilled (the job panicked), the
/// handle gets an error instead of hanging.
struct Completer<R> {
    cell: Arc<Cell<R>>,
    op: OpKind,
    rank: usize,
}

impl<R> Completer<R> {
    fn new(op: OpKind, rank: usize) -> (Completer<R>, Work<R>) {
        let cell = Arc::new(Cell {
            value: Mutex::new(None),
            cv: Condvar::new(),
            done: AtomicBool::new(false),
        });
        (
            Completer {
                cell: Arc::clone(&cell),
                op,
                rank,
            },
            Work { cell },
        )
    }

    fn fill(&self, v: Result<R>) {
        let mut value = lock(&self.cell.value);
        if !self.cell.done.load(Ordering::Relaxed) {
            *value = Some(v);
            self.cell.done.store(true, Ordering::Release);
        }
        drop(value);
        self.cell.cv.notify_all();
    }
}

impl<R> Drop for Completer<R> {
    fn drop(&mut self) {
        if !self.cell.done.load(Ordering::Acquire) {
            self.fill(Err(CommError::ProgressLost {
                op: self.op,
                rank: self.rank,
            }));
        }
    }
}

impl Communicator {
    /// Waits until every non-blocking operation issued so far has finished.
    pub(crate) fn drain(&self) {
        let progress = self.progress.borrow();
        let Some(p) = progress.as_ref() else { return };
        let target = self.issued.get();
        let mut done = lock(&p.completed.0);
        while *done < target {
            done = p
                .completed
                .1
                .wait(done)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }

    /// Queues `f` on the progress thread (started on first use).
    pub(crate) fn submit<R: Send + 'static>(
        &self,
        op: OpKind,
        f: impl FnOnce(&mut Inner) -> Result<R> + Send + 'static,
    ) -> Work<R> {
        let (completer, work) = Completer::new(op, self.rank());
        let mut progress = self.progress.borrow_mut();
        if progress.is_none() {
            match Progress::start(self.rank()) {
                Ok(p) => *progress = Some(p),
                Err(e) => {
                    completer.fill(Err(CommError::InvalidArgument {
                        what: format!("cannot start the progress thread: {e}"),
                    }));
                    return work;
                }
            }
        }
        let inner = Arc::clone(&self.inner);
        let job: Job = Box::new(move || {
            let result = f(&mut lock(&inner));
            completer.fill(result);
        });
        if let Some(p) = progress.as_ref() {
            // The receiver lives as long as `Progress`; a send error means the thread died, in
            // which case the job (and its completer) is dropped and the handle reports it.
            if p.tx.send(job).is_ok() {
                self.issued.set(self.issued.get() + 1);
            }
        }
        work
    }

    /// Non-blocking [`Communicator::collective`]: `send` (`None`: in place) and `recv` are
    /// moved in and returned by [`Work::wait`].
    pub fn collective_async<T, S, R>(
        &self,
        call: Collective,
        send: Option<S>,
        mut recv: R,
    ) -> Work<(Option<S>, R)>
    where
        T: Element,
        S: AsRef<[T]> + Send + 'static,
        R: AsMut<[T]> + Send + 'static,
    {
        self.submit(call.kind(), move |inner| {
            run_call(inner, call, send.as_ref().map(AsRef::as_ref), recv.as_mut())?;
            Ok((send, recv))
        })
    }

    fn in_place_async<T, B>(&self, call: Collective, mut buf: B) -> Work<B>
    where
        T: Element,
        B: AsMut<[T]> + Send + 'static,
    {
        self.submit(call.kind(), move |inner| {
            run_call::<T>(inner, call, None, buf.as_mut())?;
            Ok(buf)
        })
    }

    /// Non-blocking [`Communicator::all_reduce_in_place`].
    pub fn all_reduce_async<T: Element, B: AsMut<[T]> + Send + 'static>(
        &self,
        buf: B,
        op: ReduceOp,
    ) -> Work<B> {
        self.in_place_async(Collective::AllReduce(op), buf)
    }
    /// Non-blocking [`Communicator::reduce_scatter_in_place`].
    pub fn reduce_scatter_async<T: Element, B: AsMut<[T]> + Send + 'static>(
        &self,
        buf: B,
        op: ReduceOp,
    ) -> Work<B> {
        self.in_place_async(Collective::ReduceScatter(op), buf)
    }
    /// Non-blocking [`Communicator::all_gather_in_place`].
    pub fn all_gather_async<T: Element, B: AsMut<[T]> + Send + 'static>(&self, buf: B) -> Work<B> {
        self.in_place_async(Collective::AllGather, buf)
    }
    /// Non-blocking [`Communicator::broadcast_in_place`].
    pub fn broadcast_async<T: Element, B: AsMut<[T]> + Send + 'static>(
        &self,
        buf: B,
        root: usize,
    ) -> Work<B> {
        self.in_place_async(Collective::Broadcast(root), buf)
    }
    /// Non-blocking [`Communicator::reduce_in_place`].
    pub fn reduce_async<T: Element, B: AsMut<[T]> + Send + 'static>(
        &self,
        buf: B,
        op: ReduceOp,
        root: usize,
    ) -> Work<B> {
        self.in_place_async(Collective::Reduce(op, root), buf)
    }
    /// Non-blocking [`Communicator::barrier`].
    pub fn barrier_async(&self) -> Work<()> {
        self.submit(OpKind::Barrier, run_barrier)
    }
}
