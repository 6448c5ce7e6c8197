//! Non-blocking collectives over *borrowed* buffers (arena views), made sound by a scope.
//!
//! [`Communicator::scope`] runs a closure during which collectives can be started on
//! `&mut [T]` borrowed from outside the closure; it does not return until every one of them
//! finished, even if the closure panics or forgets a handle. This is `std::thread::scope`'s
//! argument: a handle cannot outlive the borrow because the scope cannot. Use it to overlap
//! communication with compute on zero-alloc arena views (which cannot be moved into
//! [`Communicator::all_reduce_async`]'s owned-buffer API).

use std::marker::PhantomData;

use crate::communicator::{run_call, Collective, Communicator};
use crate::element::Element;
use crate::error::Result;
use crate::reduce_op::ReduceOp;
use crate::work::Work;

/// A borrowed slice handed to the progress thread as raw parts.
struct RawSlice<T> {
    ptr: *mut T,
    len: usize,
}

// SAFETY: the slice is only touched by the progress thread while the scope holds the
// original `&mut [T]` unused (see `Scope::start`), and `T: Element` is `Send + Sync`.
unsafe impl<T: Element> Send for RawSlice<T> {}

/// Starts collectives on borrowed buffers; see [`Communicator::scope`].
#[derive(Debug)]
pub struct Scope<'scope, 'env: 'scope> {
    comm: &'env Communicator,
    /// Invariant in 'scope, like `std::thread::Scope`.
    _scope: PhantomData<&'scope mut &'scope ()>,
}

/// The handle of a scoped non-blocking collective; `wait` gives the buffer back.
#[derive(Debug)]
#[must_use = "wait() returns the buffer and the error"]
pub struct ScopedWork<'scope, T> {
    work: Work<()>,
    buf: &'scope mut [T],
}

impl<'scope, T> ScopedWork<'scope, T> {
    /// True once the collective finished.
    pub fn is_done(&self) -> bool {
        self.work.is_done()
    }

    /// Waits for the collective and returns its buffer.
    ///
    /// # Errors
    /// The collective's error.
    pub fn wait(self) -> Result<&'scope mut [T]> {
        self.work.wait()?;
        Ok(self.buf)
    }
}

impl<'scope> Scope<'scope, '_> {
    fn start<T: Element>(&self, call: Collective, buf: &'scope mut [T]) -> ScopedWork<'scope, T> {
        let raw = RawSlice {
            ptr: buf.as_mut_ptr(),
            len: buf.len(),
        };
        let work = self.comm.submit(call.kind(), move |inner| {
            let raw = raw;
            // SAFETY: `raw` comes from a `&'scope mut [T]` that the handle keeps borrowed and
            // unused until this job completed (`wait` returns it only after completion), and
            // `Communicator::scope` does not return before every job completed, so the memory
            // is live and unaliased while this slice exists.
            let slice = unsafe { std::slice::from_raw_parts_mut(raw.ptr, raw.len) };
            run_call::<T>(inner, call, None, slice)
        });
        ScopedWork { work, buf }
    }

    /// Non-blocking in-place all-reduce of a borrowed buffer.
    pub fn all_reduce<T: Element>(
        &self,
        buf: &'scope mut [T],
        op: ReduceOp,
    ) -> ScopedWork<'scope, T> {
        self.start(Collective::AllReduce(op), buf)
    }
    /// Non-blocking in-place reduce-scatter (rank r's result in chunk r).
    pub fn reduce_scatter<T: Element>(
        &self,
        buf: &'scope mut [T],
        op: ReduceOp,
    ) -> ScopedWork<'scope, T> {
        self.start(Collective::ReduceScatter(op), buf)
    }
    /// Non-blocking in-place all-gather (rank r's input in chunk r).
    pub fn all_gather<T: Element>(&self, buf: &'scope mut [T]) -> ScopedWork<'scope, T> {
        self.start(Collective::AllGather, buf)
    }
    /// Non-blocking in-place broadcast.
    pub fn broadcast<T: Element>(
        &self,
        buf: &'scope mut [T],
        root: usize,
    ) -> ScopedWork<'scope, T> {
        self.start(Collective::Broadcast(root), buf)
    }
    /// Non-blocking in-place reduce.
    pub fn reduce<T: Element>(
        &self,
        buf: &'scope mut [T],
        op: ReduceOp,
        root: usize,
    ) -> ScopedWork<'scope, T> {
        self.start(Collective::Reduce(op, root), buf)
    }
}

/// Waits for every submitted job when dropped (normal exit or unwinding).
struct DrainOnDrop<'a>(&'a Communicator);

impl Drop for DrainOnDrop<'_> {
    fn drop(&mut self) {
        self.0.drain();
    }
}

impl Communicator {
    /// Runs `f` with a [`Scope`] for non-blocking collectives on borrowed buffers, and returns
    /// only after all of them completed.
    ///
    /// # Examples
    /// ```
    /// use zero_comm::{local, ReduceOp};
    /// let comms = local::create(2)?;
    /// std::thread::scope(|s| for comm in comms {
    ///     s.spawn(move || {
    ///         let mut grads = vec![1.0f32; 8]; // e.g. an arena view
    ///         let mut other = vec![0.0f32; 8];
    ///         comm.scope(|sc| {
    ///             let w = sc.all_reduce(&mut grads, ReduceOp::Sum);
    ///             other.iter_mut().for_each(|x| *x += 1.0); // compute overlaps
    ///             assert_eq!(w.wait().unwrap(), &[2.0; 8]);
    ///         });
    ///     });
    /// });
    /// # Ok::<(), zero_comm::CommError>(())
    /// ```
    pub fn scope<'env, R>(
        &'env self,
        f: impl for<'scope> FnOnce(&'scope Scope<'scope, 'env>) -> R,
    ) -> R {
        let scope = Scope {
            comm: self,
            _scope: PhantomData,
        };
        let _drain = DrainOnDrop(self);
        f(&scope)
    }
}
