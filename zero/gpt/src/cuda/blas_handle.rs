//! [`BlasHandle`]: the one way the workspace holds a cuBLAS handle, so that dropping it can
//! never abort the process.
//!
//! cudarc's `CudaBlas` unwraps `cublasDestroy`'s status in its `Drop`. After a sticky CUDA
//! error (an illegal address in a kernel, say) the destroy fails, and when that drop runs
//! while a panic unwinds (the usual way a backend goes after an error) the second panic
//! aborts the process, possibly before the first error was printed. So the handle is
//! destroyed only when that is safe to try, and otherwise leaked on purpose:
//! 1. while the thread is panicking, leak it (a panic in a drop would abort);
//! 2. report an error cudarc recorded earlier, and synchronize the handle's stream: on
//!    either error the context is broken and the destroy would fail, so leak it;
//! 3. otherwise destroy it, catching a panic from cudarc's unwrap all the same, so an
//!    unexpected failure is logged rather than raised out of a drop.
//!
//! A leaked handle holds a little host and device memory until the process ends, which
//! after a sticky error is soon. Not run on a GPU.

use std::mem::ManuallyDrop;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use cudarc::cublas::{result::CublasError, sys::cublasHandle_t, CudaBlas};
use cudarc::driver::CudaStream;

/// A cuBLAS handle bound to one stream, whose drop never panics (see the module steps).
#[derive(Debug)]
pub(super) struct BlasHandle {
    blas: ManuallyDrop<CudaBlas>,
    stream: Arc<CudaStream>,
}

impl BlasHandle {
    /// A handle whose calls run on `stream`.
    pub(super) fn new(stream: Arc<CudaStream>) -> Result<Self, CublasError> {
        let blas = CudaBlas::new(Arc::clone(&stream))?;
        Ok(Self {
            blas: ManuallyDrop::new(blas),
            stream,
        })
    }

    /// The raw handle, for `cublas::result` calls.
    pub(super) fn raw(&self) -> cublasHandle_t {
        *self.blas.handle()
    }

    /// Step 2: whether the context looks healthy, logging why not.
    fn context_healthy(&self) -> bool {
        let ctx = self.stream.context();
        let problem = match ctx.check_err() {
            Err(e) => format!("an earlier asynchronous CUDA error: {e:?}"),
            Ok(()) => match self.stream.synchronize() {
                Err(e) => format!("the stream does not synchronize: {e:?}"),
                Ok(()) => return true,
            },
        };
        tracing::error!("leaking the cuBLAS handle ({problem}): cublasDestroy would fail");
        false
    }
}

/// Steps 1 and 2: destroy only when not panicking and the context is healthy (asked only
/// then, since asking synchronizes).
fn may_destroy(panicking: bool, healthy: impl FnOnce() -> bool) -> bool {
    !panicking && healthy()
}

impl Drop for BlasHandle {
    fn drop(&mut self) {
        if !may_destroy(std::thread::panicking(), || self.context_healthy()) {
            return; // leaked on purpose: the module's steps 1 and 2
        }
        // SAFETY: this is the handle's drop, so `blas` is taken once and never used again.
        let blas = unsafe { ManuallyDrop::take(&mut self.blas) };
        if catch_unwind(AssertUnwindSafe(move || drop(blas))).is_err() {
            tracing::error!("cublasDestroy failed; the cuBLAS handle is leaked");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::may_destroy;

    #[test]
    fn a_handle_is_never_destroyed_while_the_thread_panics() {
        assert!(!may_destroy(true, || panic!(
            "asked the context while panicking"
        )));
    }

    #[test]
    fn a_handle_is_destroyed_only_when_the_context_is_healthy() {
        assert!(may_destroy(false, || true));
        assert!(!may_destroy(false, || false));
    }
}
