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

use std::sync::Arc;

use cudarc::driver::CudaContext;

use crate::cuda::cuda_err;
use crate::error::Result;
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
