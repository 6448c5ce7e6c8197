//! Lending a block's memory to an operation that runs beside the arena's owner, such as a
//! collective on zero-comm's progress thread.
//!
//! [`Arena::lend`] pins the block and hands out a [`Lent`] slice that owns a reference to the
//! arena's memory, so it is `Send + 'static` and stays valid even if the arena is dropped
//! first. While lent, the block is pinned: the arena refuses to view, move, free or lend it
//! again, so the `Lent` is the only access to those bytes. [`Arena::take_back`] unpins it.
//! A `Lent` dropped without being taken back leaves its block pinned: safe, but the block is
//! then never freed or moved (like a leak).
//!
//! The rejected alternative, a `Lent` that borrows the arena, cannot cross into a thread
//! that outlives the borrow, which is the whole point.

use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Arc;

use bytemuck::Pod;

use crate::error::{AllocError, Result};
use crate::memory::HostRegion;
use crate::storage::Storage;
use crate::{Arena, Handle};

/// A pinned block's memory as a slice of `T`, lent out by [`Arena::lend`].
#[derive(Debug)]
pub struct Lent<T> {
    /// Keeps the arena's memory mapped while the slice is out.
    _region: Arc<HostRegion>,
    ptr: NonNull<T>,
    len: usize,
    handle: Handle,
    _elem: PhantomData<T>,
}

// SAFETY: the block is pinned for the Lent's life, so no other view or copy of its bytes
// exists (lend refuses pinned blocks; views, moves, frees and copies refuse them too), and
// the memory is kept alive by the Arc; moving the sole access to another thread is sound
// whenever T itself may move (T: Send).
unsafe impl<T: Send> Send for Lent<T> {}

impl<T> Lent<T> {
    /// The block this memory belongs to.
    pub fn handle(&self) -> Handle {
        self.handle
    }
}

impl<T: Pod> AsRef<[T]> for Lent<T> {
    fn as_ref(&self) -> &[T] {
        // SAFETY: `ptr` is aligned for T and covers `len` initialised elements of a live,
        // pinned block (checked by `lend`); the memory outlives `self` (the Arc), and no
        // other access exists while the block is lent.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Pod> AsMut<[T]> for Lent<T> {
    fn as_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `as_ref`; `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Arena {
    /// Pins `handle` and lends its memory out as a `Send + 'static` slice of `T`.
    ///
    /// # Errors
    ///
    /// [`AllocError::Pinned`] if the block is pinned (in flight, or lent already),
    /// [`AllocError::NoHostMemory`] for accounting or device arenas, and the errors of
    /// [`Arena::slice`] for a type that does not fit the block.
    pub fn lend<T: Pod>(&mut self, handle: Handle) -> Result<Lent<T>> {
        let (ptr, len) = self.view_parts::<T>(handle)?;
        let region = match &self.storage {
            Storage::Host(region) => Arc::clone(region),
            _ => {
                return Err(AllocError::NoHostMemory {
                    device: self.device(),
                    reason: "only host memory can be lent",
                })
            }
        };
        let ptr = NonNull::new(ptr.cast::<T>()).ok_or(AllocError::NoHostMemory {
            device: self.device(),
            reason: "null base address",
        })?;
        self.pin(handle)?;
        Ok(Lent {
            _region: region,
            ptr,
            len,
            handle,
            _elem: PhantomData,
        })
    }

    /// Ends a loan: unpins the block and returns its handle.
    ///
    /// # Errors
    ///
    /// [`AllocError::ForeignHandle`] for another arena's loan, [`AllocError::StaleHandle`].
    pub fn take_back<T>(&mut self, lent: Lent<T>) -> Result<Handle> {
        self.unpin(lent.handle)?;
        Ok(lent.handle)
    }
}

/// A pinned block of a CUDA arena lent out by [`Arena::lend_device`]: its device address,
/// valid while the loan lasts, and a reference to the arena's device memory, so the address
/// stays valid even if the arena is dropped first. As for [`Lent`], the arena neither views,
/// moves, frees nor lends a pinned block, so the loan is the only access to its bytes (what
/// a crate turning it into its own device-slice type relies on).
#[cfg(feature = "cuda")]
#[derive(Debug)]
pub struct LentDevice {
    _region: Arc<crate::cuda::DeviceRegion>,
    ptr: u64,
    len: usize,
    handle: Handle,
}

#[cfg(feature = "cuda")]
impl LentDevice {
    /// The device address (`CUdeviceptr`) of the block's first byte.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// The block's length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an empty block.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The block this memory belongs to.
    pub fn handle(&self) -> Handle {
        self.handle
    }
}

#[cfg(feature = "cuda")]
impl Arena {
    /// Pins `handle` of a CUDA arena and lends out its device address, as [`Arena::lend`]
    /// lends host memory: the block is neither viewed, moved nor freed until
    /// [`Arena::take_back_device`].
    ///
    /// # Errors
    ///
    /// [`AllocError::Pinned`] if the block is pinned, [`AllocError::InvalidConfig`] for host
    /// or accounting arenas, stale or foreign handles.
    pub fn lend_device(&mut self, handle: Handle) -> Result<LentDevice> {
        let view = self.device_view(handle)?;
        let (ptr, len) = (view.ptr(), view.len());
        let Storage::Cuda(region) = &self.storage else {
            return Err(AllocError::InvalidConfig {
                reason: format!("arena on {} has no device memory", self.device()),
            });
        };
        let region = Arc::clone(region);
        self.pin(handle)?;
        Ok(LentDevice {
            _region: region,
            ptr,
            len,
            handle,
        })
    }

    /// Ends a device loan: unpins the block and returns its handle.
    ///
    /// # Errors
    ///
    /// [`AllocError::ForeignHandle`] for another arena's loan, [`AllocError::StaleHandle`].
    pub fn take_back_device(&mut self, lent: LentDevice) -> Result<Handle> {
        self.unpin(lent.handle)?;
        Ok(lent.handle)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lent_block_is_pinned_until_taken_back() {
        let mut arena = Arena::host(4096).unwrap();
        let h = arena.alloc_elems::<f32>(16).unwrap();
        arena.slice_mut::<f32>(h).unwrap().fill(1.0);
        let mut lent = arena.lend::<f32>(h).unwrap();
        assert!(arena.slice::<f32>(h).is_err(), "viewable while lent");
        assert!(arena.free(h).is_err(), "freeable while lent");
        assert!(arena.lend::<f32>(h).is_err(), "lent twice");
        // Another thread writes through the loan.
        lent = std::thread::spawn(move || {
            lent.as_mut().iter_mut().for_each(|x| *x *= 3.0);
            lent
        })
        .join()
        .unwrap();
        assert_eq!(arena.take_back(lent).unwrap(), h);
        assert!(arena.slice::<f32>(h).unwrap().iter().all(|&x| x == 3.0));
        arena.free(h).unwrap();
    }

    #[test]
    fn a_loan_survives_its_arena() {
        let mut arena = Arena::host(4096).unwrap();
        let h = arena.alloc_elems::<u32>(8).unwrap();
        arena.slice_mut::<u32>(h).unwrap().fill(7);
        let lent = arena.lend::<u32>(h).unwrap();
        drop(arena);
        assert!(lent.as_ref().iter().all(|&x| x == 7));
    }

    #[test]
    fn defragmentation_moves_around_a_loan() {
        let mut arena = Arena::host(4096).unwrap();
        let a = arena.alloc(256).unwrap();
        let b = arena.alloc_elems::<u8>(256).unwrap();
        arena.slice_mut::<u8>(b).unwrap().fill(9);
        let lent = arena.lend::<u8>(b).unwrap();
        arena.free(a).unwrap();
        arena.defragment().unwrap();
        assert_eq!(arena.block(b).unwrap().offset, 256, "a lent block moved");
        arena.take_back(lent).unwrap();
        assert!(arena.slice::<u8>(b).unwrap().iter().all(|&x| x == 9));
    }

    #[test]
    fn accounting_arenas_lend_nothing() {
        let mut arena = Arena::accounting(4096).unwrap();
        let h = arena.alloc(64).unwrap();
        assert!(arena.lend::<u8>(h).is_err());
    }
}
