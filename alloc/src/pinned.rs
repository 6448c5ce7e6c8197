//! Page-locked ("pinned") host memory, with a fallback to pageable memory.
//!
//! Locking is an optimisation (faster, asynchronous device copies), never a requirement: when
//! the OS refuses (RLIMIT_MEMLOCK without CAP_IPC_LOCK, or not enough lockable memory) the
//! buffer stays pageable and a warning is logged, so a run never fails for it.

use bytemuck::Pod;

use crate::error::{AllocError, Result};
use crate::memory::HostRegion;

/// Alignment of pinned buffers: a page, so any element type and any DMA engine is content.
const PINNED_ALIGNMENT: usize = 4096;

/// Tries to lock a region; on refusal logs a warning, leaves it pageable and returns why.
pub(crate) fn lock_or_warn(region: &mut HostRegion) -> Option<String> {
    match region.lock() {
        Ok(()) => None,
        Err(err) => {
            tracing::warn!(
                bytes = region.len(),
                error = %err,
                "page-locking refused; falling back to pageable host memory"
            );
            Some(err.to_string())
        }
    }
}

/// Registers `region` with GPU `ordinal`'s CUDA context (feature `cuda`), else page-locks it
/// ([`lock_or_warn`]); each refusal is logged and the region stays usable.
pub(crate) fn register_or_lock(region: &mut HostRegion, ordinal: usize) {
    #[cfg(feature = "cuda")]
    match crate::cuda::register_host(region, ordinal) {
        Ok(()) => return,
        Err(err) => tracing::warn!(
            bytes = region.len(),
            error = %err,
            "cuMemHostRegister refused; page-locking with mlock instead"
        ),
    }
    #[cfg(not(feature = "cuda"))]
    tracing::warn!(
        ordinal,
        "registration with CUDA needs feature `cuda`; page-locking with mlock instead"
    );
    let _refusal = lock_or_warn(region);
}

#[derive(Debug)]
enum Memory {
    Host(HostRegion),
    #[cfg(feature = "cuda")]
    Cuda {
        // Owns the cudaHostAlloc allocation; `ptr` caches its address.
        _slice: cudarc::driver::PinnedHostSlice<u8>,
        ptr: *mut u8,
    },
}

/// A host buffer for offload: page-locked when the OS allows, pageable otherwise.
#[derive(Debug)]
pub struct PinnedBuffer {
    memory: Memory,
    len: usize,
    fallback: Option<String>,
}

// SAFETY: the buffer owns its memory outright (the CUDA variant's raw pointer points into
// the owned allocation); moving it to another thread moves that ownership.
unsafe impl Send for PinnedBuffer {}
// SAFETY: `&PinnedBuffer` only gives shared byte slices.
unsafe impl Sync for PinnedBuffer {}

impl PinnedBuffer {
    /// A zeroed buffer of `len` bytes, `mlock`ed if the OS allows (check
    /// [`is_locked`](Self::is_locked)).
    ///
    /// # Errors
    ///
    /// [`AllocError::Os`] when even pageable memory cannot be reserved; a refused lock is
    /// not an error.
    pub fn new(len: usize) -> Result<Self> {
        let mut region = HostRegion::reserve(len, PINNED_ALIGNMENT)?;
        let fallback = if len == 0 {
            None
        } else {
            lock_or_warn(&mut region)
        };
        Ok(Self {
            memory: Memory::Host(region),
            len,
            fallback,
        })
    }

    /// A buffer from `cudaHostAlloc` (portable flags 0, not write-combined, so the CPU reads
    /// it at full speed) on the context of `ordinal`; falls back to [`new`](Self::new) with a
    /// warning when the driver refuses.
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new).
    #[cfg(feature = "cuda")]
    pub fn cuda(ordinal: usize, len: usize) -> Result<Self> {
        let attempt = crate::context::untracked_context(ordinal).and_then(|ctx| {
            // SAFETY: the allocation is zeroed below before anyone can read it.
            let mut slice = unsafe { ctx.alloc_pinned_with_flags::<u8>(len.max(1), 0) }
                .map_err(crate::cuda::cuda_err("cudaHostAlloc"))?;
            let ptr = slice
                .as_mut_ptr()
                .map_err(crate::cuda::cuda_err("pinned sync"))?;
            Ok((slice, ptr))
        });
        match attempt {
            Ok((slice, ptr)) => {
                // SAFETY: `ptr` is the start of a fresh allocation of at least `len` bytes.
                unsafe { std::ptr::write_bytes(ptr, 0, len) };
                Ok(Self {
                    memory: Memory::Cuda { _slice: slice, ptr },
                    len,
                    fallback: None,
                })
            }
            Err(err) => {
                tracing::warn!(error = %err, "cudaHostAlloc refused; using mlock or pageable memory");
                let mut buf = Self::new(len)?;
                buf.fallback.get_or_insert_with(|| err.to_string());
                Ok(buf)
            }
        }
    }

    /// Length in bytes.
    #[must_use]
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length buffer.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// True when the memory is page-locked.
    #[must_use]
    pub fn is_locked(&self) -> bool {
        match &self.memory {
            Memory::Host(region) => region.is_locked(),
            #[cfg(feature = "cuda")]
            Memory::Cuda { .. } => true,
        }
    }

    /// Why the buffer is not locked, when the OS refused.
    #[must_use]
    pub fn fallback_reason(&self) -> Option<&str> {
        self.fallback.as_deref()
    }

    pub(crate) fn ptr(&self) -> *mut u8 {
        match &self.memory {
            Memory::Host(region) => region.base(),
            #[cfg(feature = "cuda")]
            Memory::Cuda { ptr, .. } => *ptr,
        }
    }

    /// The bytes.
    #[must_use]
    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: `ptr` is non-null, valid for `len` initialised (zeroed) bytes owned by
        // `self`; the shared borrow of `self` excludes writers.
        unsafe { std::slice::from_raw_parts(self.ptr(), self.len) }
    }

    /// The bytes, mutably.
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_bytes`; `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr(), self.len) }
    }

    /// The buffer as elements of `T`.
    ///
    /// # Errors
    ///
    /// [`AllocError::BadView`] when `T` does not divide the length.
    pub fn as_slice<T: Pod>(&self) -> Result<&[T]> {
        bytemuck::try_cast_slice(self.as_bytes()).map_err(|_| bad_view::<T>(self.len))
    }

    /// The buffer as mutable elements of `T`.
    ///
    /// # Errors
    ///
    /// As [`as_slice`](Self::as_slice).
    pub fn as_slice_mut<T: Pod>(&mut self) -> Result<&mut [T]> {
        let len = self.len;
        bytemuck::try_cast_slice_mut(self.as_bytes_mut()).map_err(|_| bad_view::<T>(len))
    }
}

fn bad_view<T>(len: usize) -> AllocError {
    AllocError::BadView {
        len,
        type_name: std::any::type_name::<T>(),
        elem_size: std::mem::size_of::<T>(),
        elem_align: std::mem::align_of::<T>(),
        arena_align: PINNED_ALIGNMENT,
    }
}
