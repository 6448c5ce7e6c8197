//! Host reservations: one anonymous mapping per arena or pinned buffer.
//!
//! An anonymous `mmap` with `MAP_NORESERVE` is used instead of `std::alloc` because the kernel
//! commits its pages lazily: an arena capped at 80 GB costs nothing until blocks are written,
//! which is what lets a small machine emulate a large device.

use std::io;

use memmap2::{MmapMut, MmapOptions};

use crate::error::{AllocError, Result};

/// A zero-initialised, aligned, host-addressable byte range.
#[derive(Debug)]
pub(crate) struct HostRegion {
    // Unregistered by `Drop` before `map` unmaps the range.
    #[cfg(feature = "cuda")]
    registration: Option<crate::cuda::HostRegistration>,
    // Kept only to unmap on drop; all access goes through `base`.
    map: Option<MmapMut>,
    base: *mut u8,
    len: usize,
    locked: bool,
}

// SAFETY: the region is plain memory owned by this value; the raw pointer is only a cached
// address inside `map`. Who may touch which bytes is decided by the arena (views borrow it) and
// the copy engine (which only touches pinned blocks), not by this type.
unsafe impl Send for HostRegion {}
// SAFETY: as above: `&HostRegion` only hands out the address, never a reference to the bytes.
unsafe impl Sync for HostRegion {}

impl HostRegion {
    /// Reserves `len` bytes whose start is aligned to `alignment` (a power of two).
    pub(crate) fn reserve(len: usize, alignment: usize) -> Result<Self> {
        if len == 0 {
            return Ok(Self {
                #[cfg(feature = "cuda")]
                registration: None,
                map: None,
                // Non-null and aligned, so an empty slice over it is valid.
                base: std::ptr::without_provenance_mut(alignment),
                len: 0,
                locked: false,
            });
        }
        // mmap returns page-aligned addresses; only larger alignments need slack to slide into.
        let slack = if alignment > page_size() {
            alignment
        } else {
            0
        };
        let total = len.checked_add(slack).ok_or(AllocError::SizeOverflow {
            count: len,
            elem_size: 1,
        })?;
        let mut map = MmapOptions::new()
            .len(total)
            .no_reserve_swap()
            .map_anon()
            .map_err(|source| AllocError::Os {
                what: "reserve",
                bytes: total,
                source,
            })?;
        let start = map.as_mut_ptr();
        let pad = start.align_offset(alignment);
        // SAFETY: `pad < alignment <= slack` when slack is non-zero, and 0 otherwise (mmap is
        // page aligned), so `start + pad .. start + pad + len` stays inside the mapping.
        let base = unsafe { start.add(pad) };
        Ok(Self {
            #[cfg(feature = "cuda")]
            registration: None,
            map: Some(map),
            base,
            len,
            locked: false,
        })
    }

    pub(crate) fn base(&self) -> *mut u8 {
        self.base
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Page-locked: by `mlock`, or by a CUDA registration.
    pub(crate) fn is_locked(&self) -> bool {
        #[cfg(feature = "cuda")]
        if self.registration.is_some() {
            return true;
        }
        self.locked
    }

    /// The whole mapping, in whole pages (`None` for an empty region): what a registration
    /// with CUDA covers.
    #[cfg(feature = "cuda")]
    pub(crate) fn mapping(&self) -> Option<(*mut u8, usize)> {
        let map = self.map.as_ref()?;
        let page = page_size();
        Some((map.as_ptr().cast_mut(), map.len().div_ceil(page) * page))
    }

    /// Keeps `registration` until the region drops, which unregisters it before unmapping.
    #[cfg(feature = "cuda")]
    pub(crate) fn set_registration(&mut self, registration: crate::cuda::HostRegistration) {
        // A second registration would drop the first without unregistering it.
        debug_assert!(self.registration.is_none(), "a region registered twice");
        self.registration = Some(registration);
    }

    /// Page-locks the whole mapping (`mlock`).
    pub(crate) fn lock(&mut self) -> io::Result<()> {
        if let Some(map) = &self.map {
            map.lock()?;
        }
        self.locked = true;
        Ok(())
    }
}

#[cfg(feature = "cuda")]
impl Drop for HostRegion {
    fn drop(&mut self) {
        let Some(registration) = self.registration.take() else {
            return;
        };
        if !registration.unregister() {
            // Still registered: unmapping would free memory the driver holds. The range stays
            // mapped (and locked) until the process exits.
            std::mem::forget(self.map.take());
        }
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions; it returns -1 on error, handled below.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size).unwrap_or(4096)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservation_is_aligned_beyond_a_page() {
        let region = HostRegion::reserve(1 << 16, 1 << 20).unwrap();
        assert_eq!(region.base() as usize % (1 << 20), 0);
        assert_eq!(region.len(), 1 << 16);
    }

    #[test]
    fn large_reservation_is_lazy() {
        // 64 GiB of address space on a 24 GB machine: only works if pages are not committed.
        let region = HostRegion::reserve(64 << 30, 256).unwrap();
        assert_eq!(region.len(), 64 << 30);
    }
}
