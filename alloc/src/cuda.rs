//! CUDA device memory behind an arena (feature `cuda`).
//!
//! The arena owns one `CudaSlice<u8>` and orders every copy on its own stream; its context
//! comes from [`crate::context::untracked_context`], so cudarc adds no events to it.
//!
//! The allocation is the arena's `len` bytes followed by a move scratch of
//! `min(len, MOVE_SCRATCH)` bytes that no block ever covers: a defragmentation that moves a
//! block down by a short distance stages it through the scratch ([`crate::move_plan`]), so a
//! 100 MB block moved by 256 B takes 50 copies, not 400k. (Rejected: borrowing free arena space
//! as the scratch; the only free space during a move is the `distance` bytes below the block,
//! which is exactly what is short.) The scratch is device memory the arena's `Stats` do not
//! count: at most 4 MiB per CUDA arena, beside its capacity.

use std::sync::Arc;

use cudarc::driver::{
    result as cu, sys, CudaContext, CudaSlice, CudaStream, DevicePtr, DriverError,
};

use crate::context::untracked_context;
use crate::error::{AllocError, Result};
use crate::move_plan::{plan_move_down, At};

/// Maps a driver error to the crate error, keeping the CUDA code in the message.
pub(crate) fn cuda_err(what: &'static str) -> impl Fn(DriverError) -> AllocError {
    move |err| AllocError::Cuda {
        what,
        message: format!("{err:?}"),
    }
}

/// The most device memory a CUDA arena holds beside its capacity, as the scratch of its moves.
pub(crate) const MOVE_SCRATCH: usize = 4 << 20;

/// One device allocation and the stream that orders its copies.
#[derive(Debug)]
pub(crate) struct DeviceRegion {
    stream: Arc<CudaStream>,
    // Offload copies run here so they overlap kernels on the compute streams.
    copy_stream: Arc<CudaStream>,
    // Owns the allocation; addresses are taken once from it.
    _buf: CudaSlice<u8>,
    base: sys::CUdeviceptr,
    len: usize,
    // The move scratch starts at `base + len`.
    scratch_len: usize,
}

impl DeviceRegion {
    pub(crate) fn new(ordinal: usize, len: usize) -> Result<Self> {
        // Untracked (`crate::context`): every other stream that touches the region orders
        // itself after `stream` (it waits for it from the host, or on an event recorded on
        // it) before using an address, so it also comes after the allocation and zeroing.
        let ctx = untracked_context(ordinal)?;
        let stream = ctx.default_stream();
        let copy_stream = ctx.new_stream().map_err(cuda_err("new_stream"))?;
        let scratch_len = MOVE_SCRATCH.min(len);
        let buf = stream
            .alloc_zeros::<u8>((len + scratch_len).max(1))
            .map_err(cuda_err("alloc_zeros"))?;
        let base = {
            let (ptr, _sync) = buf.device_ptr(&stream);
            ptr
        };
        Ok(Self {
            stream,
            copy_stream,
            _buf: buf,
            base,
            len,
            scratch_len,
        })
    }

    pub(crate) fn base(&self) -> sys::CUdeviceptr {
        self.base
    }

    /// Moves `len` bytes down from `src` to `dst` (offsets), ranges possibly overlapping. A
    /// device memcpy of overlapping ranges is undefined, so the move runs
    /// [`plan_move_down`]'s copies, whose ranges never overlap, in order on the arena's stream.
    /// Not run on a GPU.
    pub(crate) fn move_down(&self, src: usize, dst: usize, len: usize) -> Result<()> {
        assert!(
            dst < src && src + len <= self.len,
            "device move out of range"
        );
        self.bind()?;
        let scratch = self.base + self.len as u64;
        let address = |at| match at {
            At::Region(offset) => self.base + offset as u64,
            At::Scratch => scratch,
        };
        for step in plan_move_down(src, dst, len, self.scratch_len) {
            // SAFETY: region ranges lie inside the arena's bytes (asserted: every planned
            // range is within `dst..src + len`), a scratch range within the `scratch_len`
            // bytes after them (a step never exceeds `scratch_len` when it touches the
            // scratch); a step's two ranges do not overlap (the plan's guarantee, tested on
            // the host); the steps run in order on the arena's own stream.
            unsafe {
                cu::memcpy_dtod_async(
                    address(step.to),
                    address(step.from),
                    step.len,
                    self.stream.cu_stream(),
                )
            }
            .map_err(cuda_err("memcpy_dtod_async"))?;
        }
        Ok(())
    }

    /// Makes the region's context current on the calling thread: the raw driver calls below
    /// act on the current context, and an arena may be used from a thread that never bound
    /// it.
    fn bind(&self) -> Result<()> {
        Ok(crate::context::bind(self.stream.context())?)
    }

    /// Copies host bytes into the region at `offset`, ordered on the default (arena) stream.
    ///
    /// The call returns once `src` may be reused; from pageable memory the bytes may still be
    /// on their way to the device. Every other stream orders itself after the default stream
    /// (the copy stream and device-local peers wait for it from the host, NCCL and the
    /// activation copier wait on an event recorded on it), so no reader sees the range early.
    pub(crate) fn write(&self, offset: usize, src: &[u8]) -> Result<()> {
        assert!(offset + src.len() <= self.len, "device write out of range");
        self.bind()?;
        // SAFETY: the destination range is inside the allocation (asserted); the copy is
        // synchronous so `src` outlives it.
        unsafe { cu::memcpy_htod_sync(self.base + offset as u64, src) }
            .map_err(cuda_err("memcpy_htod"))
    }

    /// Copies bytes at `offset` to the host and waits.
    pub(crate) fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        assert!(offset + dst.len() <= self.len, "device read out of range");
        self.bind()?;
        self.synchronize()?;
        // SAFETY: the source range is inside the allocation (asserted); the copy is
        // synchronous so `dst` outlives it.
        unsafe { cu::memcpy_dtoh_sync(dst, self.base + offset as u64) }
            .map_err(cuda_err("memcpy_dtoh"))
    }

    /// Offload copy on the copy stream, from any thread: region bytes at `offset` to `dst`
    /// (`to_host`) or `dst` to the region. Waits for completion.
    pub(crate) fn copy_on_copy_stream(
        &self,
        offset: usize,
        host: *mut u8,
        len: usize,
        to_host: bool,
    ) -> Result<()> {
        assert!(offset + len <= self.len, "device copy out of range");
        self.bind()?;
        // Moves by a defragmentation are ordered on the arena stream; wait for them first.
        self.synchronize()?;
        let dev = self.base + offset as u64;
        let stream = self.copy_stream.cu_stream();
        // SAFETY: the device range is inside the allocation (asserted); the host range is
        // `len` bytes owned by the in-flight job, which outlives the copy because we wait on
        // the copy stream before returning.
        unsafe {
            if to_host {
                let dst = std::slice::from_raw_parts_mut(host, len);
                cu::memcpy_dtoh_async(dst, dev, stream)
            } else {
                let src = std::slice::from_raw_parts(host.cast_const(), len);
                cu::memcpy_htod_async(dev, src, stream)
            }
        }
        .map_err(cuda_err("offload memcpy"))?;
        self.copy_stream
            .synchronize()
            .map_err(cuda_err("copy stream synchronize"))
    }

    /// The stream that orders the arena's copies and moves.
    pub(crate) fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Waits for every copy issued on the arena's stream.
    pub(crate) fn synchronize(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(cuda_err("stream synchronize"))
    }
}

/// A host range registered with a CUDA context (`cuMemHostRegister`). Held by the
/// [`HostRegion`](crate::memory::HostRegion) it covers, whose drop calls
/// [`HostRegistration::unregister`] before unmapping the range (and keeps it mapped when that
/// fails).
#[derive(Debug)]
pub(crate) struct HostRegistration {
    ctx: Arc<CudaContext>,
    ptr: *mut std::ffi::c_void,
}

// SAFETY: the value only holds the registered address to unregister it; it gives no access to
// the bytes, and the driver's registration is process-wide (PORTABLE), not thread-bound.
unsafe impl Send for HostRegistration {}
// SAFETY: as above: `&HostRegistration` exposes nothing.
unsafe impl Sync for HostRegistration {}

/// Registers `region`'s whole mapping with GPU `ordinal`'s context, page-locked and visible
/// to every context (`CU_MEMHOSTREGISTER_PORTABLE`), and hands the registration to the region.
pub(crate) fn register_host(region: &mut crate::memory::HostRegion, ordinal: usize) -> Result<()> {
    let Some((ptr, len)) = region.mapping() else {
        return Ok(());
    };
    let ctx = untracked_context(ordinal)?;
    crate::context::bind(&ctx)?;
    let ptr = ptr.cast::<std::ffi::c_void>();
    // SAFETY: `ptr..ptr + len` is the region's own anonymous mapping, in whole pages (mmap
    // maps whole pages), and the region keeps it mapped until after the registration drops.
    unsafe { sys::cuMemHostRegister_v2(ptr, len, sys::CU_MEMHOSTREGISTER_PORTABLE) }
        .result()
        .map_err(cuda_err("cuMemHostRegister"))?;
    region.set_registration(HostRegistration { ctx, ptr });
    Ok(())
}

impl HostRegistration {
    /// Unregisters the range; `false` when the driver refused, in which case the range must
    /// stay mapped (CUDA requires registered memory to be unregistered before it is freed, and
    /// a new mapping at the same address would inherit the stale registration).
    pub(crate) fn unregister(self) -> bool {
        // An earlier error is not this call's: log it and unregister all the same.
        if let Err(err) = self.ctx.check_err() {
            tracing::error!(error = ?err, "an earlier asynchronous CUDA error, reported now");
        }
        if let Err(err) = self.ctx.bind_to_thread() {
            tracing::error!(error = %err, "cannot bind the context to unregister host memory");
            return false;
        }
        // SAFETY: `ptr` was registered by `register_host` and is still mapped (the region
        // unmaps it only after this returns `true`); no copy can be in flight, since every
        // arena copy completes before the arena can drop.
        match unsafe { sys::cuMemHostUnregister(self.ptr) }.result() {
            Ok(()) => true,
            Err(err) => {
                tracing::error!(error = %err, "cuMemHostUnregister failed");
                false
            }
        }
    }
}
