//! The one place the workspace opens CUDA contexts (feature `cuda`), and how it orders
//! streams without cudarc's event tracking.
//!
//! cudarc tracks a `CudaSlice`'s last read and write with events once a second stream exists
//! on its `CudaContext` object, recording them when a device-pointer guard drops. The
//! workspace hands device addresses to kernels, cuBLAS and NCCL through views made before the
//! launch, so those events would be recorded before the work they stand for, and a stream
//! waiting on them would not wait for it. Every context is therefore opened here with
//! tracking off, before any stream or allocation exists, and the workspace orders streams
//! itself. The ordering argument, cited by `// SAFETY:` comments as O1 to O3:
//!
//! - O1 (one compute stream): a rank's kernels, cuBLAS calls and arena copies that read or
//!   write its buffers run in order on one stream (the backend's stream, or the context's
//!   default stream that CUDA arenas and the engine's kernels use).
//! - O2 (explicit waits): another stream (offload copies, NCCL, device-local peers) touches
//!   an address written on a different stream only after it waited on an event recorded on
//!   that stream after the write (`CudaStream::wait`), or after a host synchronize of it;
//!   and the writing stream waits the same way before it reuses an address the other stream
//!   reads or writes.
//! - O3 (frees): a `CudaSlice` is dropped (its memory freed in order on its own stream) only
//!   after the other streams that used it were waited for under O2.
//!
//! Stale errors: cudarc records an error raised in a `Drop` (which cannot return it) in the
//! `CudaContext`, and its next `bind_to_thread` returns it, as if the call that binds had
//! failed. Operations therefore start with [`bind`], which names such an error as an earlier
//! one ([`BindError::Earlier`]) instead of the new call's own failure.

use std::sync::Arc;

use cudarc::driver::{CudaContext, DriverError};

use crate::cuda::cuda_err;
use crate::error::{AllocError, Result};
use crate::libraries::CudaLibrary;

/// Opens the context of GPU `ordinal` with cudarc's event tracking off, after checking the
/// driver library exists (cudarc panics when it does not). Every CUDA user in the workspace
/// opens its contexts here.
///
/// # Errors
/// [`crate::AllocError::CudaUnavailable`] without the driver, [`crate::AllocError::Cuda`]
/// when the device cannot be opened.
pub fn untracked_context(ordinal: usize) -> Result<Arc<CudaContext>> {
    CudaLibrary::Driver.require()?;
    let ctx = CudaContext::new(ordinal).map_err(cuda_err("CudaContext::new"))?;
    // SAFETY: tracking is off before this `CudaContext` object made any stream or slice, so
    // no slice ever carries events; the workspace orders its streams by O1 to O3 instead.
    unsafe { ctx.disable_event_tracking() };
    Ok(ctx)
}

/// Why [`bind`] failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BindError {
    /// An error cudarc recorded earlier (in a `Drop`, or by an asynchronous operation whose
    /// failure it could not return), not one of the call about to start.
    #[error("an earlier asynchronous CUDA error, reported at the next call: {0:?}")]
    Earlier(DriverError),
    /// Making the context current failed.
    #[error("cuCtxSetCurrent failed: {0:?}")]
    Bind(DriverError),
}

impl BindError {
    /// What failed, where an error type names an operation ("{op} failed: {code}").
    #[must_use]
    pub fn op(&self) -> &'static str {
        match self {
            Self::Earlier(_) => {
                "an earlier asynchronous CUDA operation (reported at the next call)"
            }
            Self::Bind(_) => "cuCtxSetCurrent",
        }
    }

    /// The driver's error, code included.
    #[must_use]
    pub fn driver_error(&self) -> DriverError {
        match *self {
            Self::Earlier(e) | Self::Bind(e) => e,
        }
    }
}

impl From<BindError> for AllocError {
    fn from(e: BindError) -> Self {
        AllocError::Cuda {
            what: e.op(),
            message: format!("{:?}", e.driver_error()),
        }
    }
}

/// Makes `ctx` current on the calling thread, first reporting an error cudarc recorded
/// earlier as [`BindError::Earlier`] (see the module's note on stale errors).
///
/// # Errors
/// As [`BindError`].
pub fn bind(ctx: &CudaContext) -> std::result::Result<(), BindError> {
    ctx.check_err().map_err(BindError::Earlier)?;
    ctx.bind_to_thread().map_err(BindError::Bind)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cudarc::driver::sys::cudaError_enum::CUDA_ERROR_ILLEGAL_ADDRESS;

    #[test]
    fn an_earlier_error_is_named_as_earlier_and_keeps_its_code() {
        // Only names and codes: formatting a DriverError asks the driver for its text.
        let code = DriverError(CUDA_ERROR_ILLEGAL_ADDRESS);
        let (earlier, bind) = (BindError::Earlier(code), BindError::Bind(code));
        assert!(earlier
            .op()
            .starts_with("an earlier asynchronous CUDA operation"));
        assert_eq!(bind.op(), "cuCtxSetCurrent");
        assert_eq!((earlier.driver_error(), bind.driver_error()), (code, code));
    }
}
