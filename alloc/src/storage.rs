//! The memory behind an arena, as one enum so the arena logic is written once.

use std::sync::Arc;

use crate::config::Backing;
use crate::error::{AllocError, Result};
use crate::memory::HostRegion;
use crate::Device;

#[derive(Debug)]
pub(crate) enum Storage {
    /// Accounting mode: no bytes.
    None,
    /// Host memory; shared with the copy engine so an in-flight copy keeps it alive.
    Host(Arc<HostRegion>),
    /// CUDA device memory.
    #[cfg(feature = "cuda")]
    Cuda(Arc<crate::cuda::DeviceRegion>),
}

impl Storage {
    pub(crate) fn new(
        device: Device,
        backing: Backing,
        len: usize,
        alignment: usize,
    ) -> Result<Self> {
        match (device, backing) {
            (_, Backing::Accounting) => Ok(Self::None),
            (Device::Cpu, Backing::Memory) => {
                Ok(Self::Host(Arc::new(HostRegion::reserve(len, alignment)?)))
            }
            (Device::Cpu, Backing::Pinned) => {
                let mut region = HostRegion::reserve(len, alignment)?;
                // A refusal is logged there; the arena still works on pageable memory.
                let _refusal = crate::pinned::lock_or_warn(&mut region);
                Ok(Self::Host(Arc::new(region)))
            }
            (Device::Cpu, Backing::CudaRegistered(ordinal)) => {
                let mut region = HostRegion::reserve(len, alignment)?;
                crate::pinned::register_or_lock(&mut region, ordinal);
                Ok(Self::Host(Arc::new(region)))
            }
            (Device::Cuda(_), Backing::Pinned | Backing::CudaRegistered(_)) => {
                Err(AllocError::InvalidConfig {
                    reason: "pinned backing is host memory; use Device::Cpu".into(),
                })
            }
            #[cfg(feature = "cuda")]
            (Device::Cuda(ordinal), Backing::Memory) => Ok(Self::Cuda(Arc::new(
                crate::cuda::DeviceRegion::new(ordinal, len)?,
            ))),
            #[cfg(not(feature = "cuda"))]
            (device @ Device::Cuda(_), Backing::Memory) => {
                Err(AllocError::NotCompiledWithCuda { device })
            }
        }
    }

    /// Base address of host-addressable storage.
    pub(crate) fn host_base(&self, device: Device) -> Result<*mut u8> {
        match self {
            Self::Host(region) => Ok(region.base()),
            Self::None => Err(AllocError::NoHostMemory {
                device,
                reason: "accounting mode",
            }),
            #[cfg(feature = "cuda")]
            Self::Cuda(_) => Err(AllocError::NoHostMemory {
                device,
                reason: "device memory",
            }),
        }
    }

    /// Moves `len` bytes from `src` to `dst` (offsets; `dst < src`, ranges may overlap).
    pub(crate) fn move_down(&self, src: usize, dst: usize, len: usize) -> Result<()> {
        debug_assert!(dst < src);
        match self {
            Self::None => Ok(()),
            Self::Host(region) => {
                assert!(src + len <= region.len(), "move past the end of the region");
                // SAFETY: both ranges lie inside the region (asserted; dst < src); the arena
                // calls this under `&mut self` for unpinned blocks only, so no view or copy
                // touches them; `ptr::copy` is memmove, correct for overlapping ranges.
                unsafe {
                    std::ptr::copy(region.base().add(src), region.base().add(dst), len);
                }
                Ok(())
            }
            #[cfg(feature = "cuda")]
            Self::Cuda(region) => region.move_down(src, dst, len),
        }
    }

    /// The device base address of CUDA storage.
    #[cfg(feature = "cuda")]
    pub(crate) fn device_base(&self) -> Option<u64> {
        match self {
            Self::Cuda(region) => Some(region.base()),
            _ => None,
        }
    }

    /// The stream that orders CUDA storage's copies and moves.
    #[cfg(feature = "cuda")]
    pub(crate) fn device_stream(&self) -> Option<&std::sync::Arc<cudarc::driver::CudaStream>> {
        match self {
            Self::Cuda(region) => Some(region.stream()),
            _ => None,
        }
    }

    /// Waits for every move issued so far (device copies are asynchronous).
    pub(crate) fn finish(&self) -> Result<()> {
        match self {
            #[cfg(feature = "cuda")]
            Self::Cuda(region) => region.synchronize(),
            _ => Ok(()),
        }
    }

    /// Copies `src` into the storage at `offset`; the caller checked the range is a block's.
    pub(crate) fn write(&self, device: Device, offset: usize, src: &[u8]) -> Result<()> {
        match self {
            #[cfg(feature = "cuda")]
            Self::Cuda(region) => region.write(offset, src),
            _ => {
                let base = self.host_base(device)?;
                self.assert_in_bounds(offset, src.len());
                // SAFETY: in bounds (asserted); the caller (the arena, under `&mut self`) checked that
                // `offset..offset + src.len()` is inside one unpinned block of the region.
                unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), base.add(offset), src.len()) };
                Ok(())
            }
        }
    }

    /// Copies storage bytes at `offset` into `dst`; the caller checked the range.
    pub(crate) fn read(&self, device: Device, offset: usize, dst: &mut [u8]) -> Result<()> {
        match self {
            #[cfg(feature = "cuda")]
            Self::Cuda(region) => region.read(offset, dst),
            _ => {
                let base = self.host_base(device)?;
                self.assert_in_bounds(offset, dst.len());
                // SAFETY: in bounds (asserted); the caller checked that `offset..offset + dst.len()` is inside one
                // unpinned block; no mutable view can exist while it holds `&self`.
                unsafe {
                    std::ptr::copy_nonoverlapping(base.add(offset), dst.as_mut_ptr(), dst.len())
                };
                Ok(())
            }
        }
    }

    fn assert_in_bounds(&self, offset: usize, len: usize) {
        if let Self::Host(region) = self {
            assert!(
                offset
                    .checked_add(len)
                    .is_some_and(|end| end <= region.len()),
                "copy outside the region"
            );
        }
    }
}
