//! Typed views of blocks as CPU slices.
//!
//! Borrow rules: a shared view borrows the arena shared, a mutable view borrows it mutably,
//! so no allocation, free or defragmentation (all `&mut self`) can happen while a view lives:
//! the compiler enforces it. Several mutable views at once go through [`Views`], which holds
//! the arena's mutable borrow for its lifetime and checks at run time that no block is handed
//! out mutably twice (blocks never overlap, so distinct blocks give disjoint slices).
//!
//! A view cannot outlive a defragmentation; this does not compile:
//!
//! ```compile_fail
//! let mut arena = zero_alloc::Arena::host(4096).unwrap();
//! let h = arena.alloc(64).unwrap();
//! let view = arena.slice::<f32>(h).unwrap();
//! arena.defragment().unwrap(); // error: `arena` is borrowed by `view`
//! println!("{}", view[0]);
//! ```

use std::any::type_name;
use std::marker::PhantomData;
use std::mem::{align_of, size_of};

use bytemuck::Pod;

use crate::error::{AllocError, Result};
use crate::{Arena, Handle};

impl Arena {
    /// Checks a handle for viewing as `T` and returns (address, element count).
    pub(crate) fn view_parts<T: Pod>(&self, handle: Handle) -> Result<(*mut u8, usize)> {
        let block = *self.live(handle)?;
        let base = self.storage.host_base(self.device())?;
        if block.pins > 0 {
            return Err(AllocError::Pinned {
                handle,
                pins: block.pins,
                action: "viewed",
            });
        }
        let (size, align) = (size_of::<T>(), align_of::<T>());
        if size == 0 || block.len % size != 0 || align > self.config().alignment {
            return Err(AllocError::BadView {
                len: block.len,
                type_name: type_name::<T>(),
                elem_size: size,
                elem_align: align,
                arena_align: self.config().alignment,
            });
        }
        // SAFETY: the block lies inside the reservation (offset + size <= capacity, kept by
        // the free list), so the offset stays in bounds of the host region.
        let ptr = unsafe { base.add(block.offset) };
        Ok((ptr, block.len / size))
    }

    /// The block as a slice of `T`.
    ///
    /// # Errors
    ///
    /// [`AllocError::NoHostMemory`] for accounting or device arenas, [`AllocError::BadView`]
    /// when `T` does not divide the block, [`AllocError::Pinned`] during an in-flight copy,
    /// stale or foreign handles.
    pub fn slice<T: Pod>(&self, handle: Handle) -> Result<&[T]> {
        let (ptr, len) = self.view_parts::<T>(handle)?;
        // SAFETY: `ptr` is aligned for T (base aligned to the arena alignment >= align_of T,
        // offsets are multiples of it) and covers `len * size_of::<T>()` initialised bytes
        // (the mapping is zero-filled, T is Pod). Mutation needs `&mut self`, excluded for the
        // lifetime of this borrow; the block is unpinned so the copy engine does not touch it.
        Ok(unsafe { std::slice::from_raw_parts(ptr.cast::<T>(), len) })
    }

    /// The block as a mutable slice of `T`.
    ///
    /// # Errors
    ///
    /// As [`slice`](Self::slice).
    pub fn slice_mut<T: Pod>(&mut self, handle: Handle) -> Result<&mut [T]> {
        let (ptr, len) = self.view_parts::<T>(handle)?;
        // SAFETY: as in `slice`; `&mut self` makes this the only view of any block.
        Ok(unsafe { std::slice::from_raw_parts_mut(ptr.cast::<T>(), len) })
    }

    /// `N` mutable views of distinct blocks at once.
    ///
    /// # Errors
    ///
    /// [`AllocError::AlreadyBorrowed`] when a handle repeats; otherwise as
    /// [`slice`](Self::slice).
    pub fn slices_mut<T: Pod, const N: usize>(
        &mut self,
        handles: [Handle; N],
    ) -> Result<[&mut [T]; N]> {
        let mut views = self.views();
        let mut out = Vec::with_capacity(N);
        for h in handles {
            out.push(views.get_mut::<T>(h)?);
        }
        // The loop pushed exactly N views.
        out.try_into().map_err(|_| AllocError::InvalidConfig {
            reason: "internal: view count mismatch".into(),
        })
    }

    /// A set of simultaneous views of distinct blocks, each of its own element type.
    ///
    /// # Examples
    ///
    /// ```
    /// use half::bf16;
    /// use zero_alloc::Arena;
    ///
    /// let mut arena = Arena::host(1 << 16)?;
    /// let (params, grads, moments) =
    ///     (arena.alloc_elems::<bf16>(8)?, arena.alloc_elems::<bf16>(8)?, arena.alloc_elems::<f32>(8)?);
    /// let mut views = arena.views();
    /// let p = views.get::<bf16>(params)?; // (8,)
    /// let g = views.get_mut::<bf16>(grads)?; // (8,)
    /// let m = views.get_mut::<f32>(moments)?; // (8,)
    /// g[0] = p[0];
    /// m[0] = 1.0;
    /// assert!(views.get_mut::<f32>(moments).is_err()); // already borrowed
    /// # Ok::<(), zero_alloc::AllocError>(())
    /// ```
    pub fn views(&mut self) -> Views<'_> {
        Views {
            arena: self,
            taken: Vec::new(),
            _exclusive: PhantomData,
        }
    }
}

/// Simultaneous views of distinct blocks, from [`Arena::views`]. Holds the arena's mutable
/// borrow for `'a`, so nothing can move while any view it handed out lives.
#[derive(Debug)]
pub struct Views<'a> {
    // Shared reborrow of the exclusive borrow: the block table is only read from here on.
    arena: &'a Arena,
    // (slot, mutable) of every view handed out.
    taken: Vec<(u32, bool)>,
    _exclusive: PhantomData<&'a mut Arena>,
}

impl<'a> Views<'a> {
    fn claim(&mut self, handle: Handle, mutable: bool) -> Result<()> {
        let clash = self
            .taken
            .iter()
            .any(|&(slot, was_mut)| slot == handle.slot && (mutable || was_mut));
        if clash {
            return Err(AllocError::AlreadyBorrowed { handle });
        }
        Ok(())
    }

    /// A shared view; the same block may be viewed shared any number of times.
    ///
    /// # Errors
    ///
    /// [`AllocError::AlreadyBorrowed`] if the block was handed out mutably; otherwise as
    /// [`Arena::slice`].
    pub fn get<T: Pod>(&mut self, handle: Handle) -> Result<&'a [T]> {
        let (ptr, len) = self.arena.view_parts::<T>(handle)?;
        self.claim(handle, false)?;
        self.taken.push((handle.slot, false));
        // SAFETY: `view_parts` checked bounds, alignment and pins as for `Arena::slice`. The
        // arena is exclusively borrowed for 'a, and `claim` proved no mutable view of this
        // block was handed out; other blocks never overlap this one.
        Ok(unsafe { std::slice::from_raw_parts(ptr.cast::<T>(), len) })
    }

    /// A mutable view of a block not yet handed out by this set.
    ///
    /// # Errors
    ///
    /// [`AllocError::AlreadyBorrowed`] if the block was handed out before; otherwise as
    /// [`Arena::slice`].
    pub fn get_mut<T: Pod>(&mut self, handle: Handle) -> Result<&'a mut [T]> {
        let (ptr, len) = self.arena.view_parts::<T>(handle)?;
        self.claim(handle, true)?;
        self.taken.push((handle.slot, true));
        // SAFETY: as in `get`; `claim` proved this block has no other view from this set,
        // and the exclusive borrow rules out views from anywhere else.
        Ok(unsafe { std::slice::from_raw_parts_mut(ptr.cast::<T>(), len) })
    }
}

/// A block's device address under `cuda`, from [`Arena::device_view`]. It borrows the arena,
/// so the block cannot be moved or freed while the address is held.
#[cfg(feature = "cuda")]
#[derive(Clone, Copy, Debug)]
pub struct DeviceView<'a> {
    /// The device address (`CUdeviceptr`) of the block's first byte.
    pub ptr: u64,
    /// The block's length in bytes.
    pub len: usize,
    _arena: PhantomData<&'a Arena>,
}

#[cfg(feature = "cuda")]
impl Arena {
    /// The device address of a block of a CUDA arena.
    ///
    /// # Errors
    ///
    /// [`AllocError::InvalidConfig`] for a host or accounting arena; stale, foreign or pinned
    /// handles as [`Arena::slice`].
    pub fn device_view(&self, handle: Handle) -> Result<DeviceView<'_>> {
        let block = *self.live(handle)?;
        if block.pins > 0 {
            return Err(AllocError::Pinned {
                handle,
                pins: block.pins,
                action: "viewed",
            });
        }
        let base = self
            .storage
            .device_base()
            .ok_or_else(|| AllocError::InvalidConfig {
                reason: format!("arena on {} has no device memory", self.device()),
            })?;
        Ok(DeviceView {
            ptr: base + block.offset as u64,
            len: block.len,
            _arena: PhantomData,
        })
    }

    /// The stream on which a CUDA arena orders its copies and defragmentation moves (`None`
    /// for a host or accounting arena). Another stream that works on a block orders itself
    /// after this one with an event, and this one after it the same way, instead of
    /// [`Arena::synchronize`] on the host.
    pub fn cuda_stream(&self) -> Option<&std::sync::Arc<cudarc::driver::CudaStream>> {
        self.storage.device_stream()
    }
}
