//! Typed views of blocks as CPU slices.
//!
//! Borrow rules: a shared view borrows the arena shared, a mutable view borrows it mutably,
//! so no allocation, free or defragmentation (all `&mut self`) can happen while a view lives:
//! the compiler enforces it. Several mutable views at once go through [`Views`], which holds
//! the arena's mutable borrow for its lifetime and checks at run time that no block is handed
//! out mutably twice (blocks never overlap, so distinct blocks give disjoint slices).
//!
//! Device views (feature `cuda`) are the same borrows of a CUDA arena's blocks, carrying a
//! device address instead of a slice: [`DeviceView`] (shared, from [`Arena::device_view`] or
//! [`Views::device`]) and [`DeviceViewMut`] (exclusive, only from [`Views::device_mut`]). A
//! crate with its own device-slice type turns them into references (zero-gpt's
//! `DeviceSlice::from_view`), relying on the guarantees V1 to V3 stated on [`DeviceView`].
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
#[cfg(feature = "cuda")]
use std::ops::Range;

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
    /// Records a view of `handle`, refusing it when it clashes with one handed out before:
    /// a mutable view clashes with any view of its block, a shared one with a mutable one.
    /// Callers check the view itself first, so a refused view claims nothing.
    fn claim(&mut self, handle: Handle, mutable: bool) -> Result<()> {
        let clash = self
            .taken
            .iter()
            .any(|&(slot, was_mut)| slot == handle.slot && (mutable || was_mut));
        if clash {
            return Err(AllocError::AlreadyBorrowed { handle });
        }
        self.taken.push((handle.slot, mutable));
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
        // SAFETY: as in `get`; `claim` proved this block has no other view from this set,
        // and the exclusive borrow rules out views from anywhere else.
        Ok(unsafe { std::slice::from_raw_parts_mut(ptr.cast::<T>(), len) })
    }
}

/// A shared view of a block of a CUDA arena, or of an element range of one: its device
/// address and byte length, borrowing the arena for `'a`. It records no CUDA event: work on
/// the arena's stream ([`Arena::cuda_stream`]) sees the block in stream order, and other
/// streams order themselves after it with events.
///
/// What a device view guarantees, for a crate that turns it into a reference to its own
/// device-slice type (cited by that crate's `// SAFETY:` comments):
/// - V1 (bounds): the address and length lie inside one live, unpinned block of the arena's
///   device memory; a [`range`](Self::range) lies inside its parent and its address is a
///   multiple of its element type's alignment (both checked).
/// - V2 (lifetime): the view borrows the arena for `'a` (shared, or through a [`Views`] set's
///   exclusive borrow); allocation, free, defragmentation, pinning and lending all need
///   `&mut Arena`, so the block neither moves nor goes while the view lives.
/// - V3 (aliasing): nothing writes a block through `&Arena` or a `DeviceView`; a
///   [`DeviceViewMut`] is the only view of its block, since it comes only from a [`Views`]
///   set, which holds the arena's exclusive borrow and hands a block out mutably only when it
///   has handed out no other view of it (the claim check host views go through too).
#[cfg(feature = "cuda")]
#[derive(Clone, Copy, Debug)]
pub struct DeviceView<'a> {
    ptr: u64,
    len: usize,
    _arena: PhantomData<&'a Arena>,
}

/// An exclusive view of a block of a CUDA arena, or of an element range of one, from
/// [`Views::device_mut`]: the only view of those bytes while it lives ([`DeviceView`]'s V1 to
/// V3 hold for it). Not `Clone`: a copy would be a second exclusive view.
#[cfg(feature = "cuda")]
#[derive(Debug)]
pub struct DeviceViewMut<'a> {
    ptr: u64,
    len: usize,
    _arena: PhantomData<&'a mut Arena>,
}

/// Where elements `elems` of `T` lie in `len` bytes at `ptr`: (address, byte length).
#[cfg(feature = "cuda")]
fn sub_range<T: Pod>(ptr: u64, len: usize, elems: Range<usize>) -> Result<(u64, usize)> {
    let (size, align) = (size_of::<T>(), align_of::<T>());
    let bytes = elems
        .start
        .checked_mul(size)
        .zip(elems.end.checked_mul(size));
    let inside = bytes.filter(|&(start, end)| start <= end && end <= len);
    // Inside the parent, so the sum stays within the allocation's addresses.
    let addr = inside.map(|(start, _)| ptr + start as u64);
    match (inside, addr) {
        (Some((start, end)), Some(addr)) if addr % align as u64 == 0 => Ok((addr, end - start)),
        _ => Err(AllocError::BadRange {
            addr: ptr,
            len,
            start: elems.start,
            end: elems.end,
            type_name: type_name::<T>(),
            elem_size: size,
            elem_align: align,
        }),
    }
}

macro_rules! device_view_methods {
    ($name:ident) => {
        #[cfg(feature = "cuda")]
        impl<'a> $name<'a> {
            /// The device address (`CUdeviceptr`) of the view's first byte.
            #[must_use]
            pub fn ptr(&self) -> u64 {
                self.ptr
            }

            /// The view's length in bytes.
            #[must_use]
            pub fn len(&self) -> usize {
                self.len
            }

            /// True for a view of no bytes.
            #[must_use]
            pub fn is_empty(&self) -> bool {
                self.len == 0
            }

            /// The view of elements `elems` of `T` (the view read as an array of `T` from its
            /// first byte), keeping the borrow.
            ///
            /// # Errors
            ///
            /// [`AllocError::BadRange`] when the range is reversed, does not fit the view, or
            /// starts at an address not aligned for `T`.
            pub fn range<T: Pod>(self, elems: Range<usize>) -> Result<Self> {
                let (ptr, len) = sub_range::<T>(self.ptr, self.len, elems)?;
                Ok(Self {
                    ptr,
                    len,
                    _arena: PhantomData,
                })
            }
        }
    };
}

device_view_methods!(DeviceView);
device_view_methods!(DeviceViewMut);

#[cfg(feature = "cuda")]
impl Arena {
    /// A shared view of a whole block of a CUDA arena.
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

#[cfg(feature = "cuda")]
impl<'a> Views<'a> {
    /// A shared device view of a whole block of a CUDA arena, beside the set's other views.
    ///
    /// # Errors
    ///
    /// [`AllocError::AlreadyBorrowed`] if the block was handed out mutably; otherwise as
    /// [`Arena::device_view`].
    pub fn device(&mut self, handle: Handle) -> Result<DeviceView<'a>> {
        let view = self.arena.device_view(handle)?;
        self.claim(handle, false)?;
        Ok(view)
    }

    /// An exclusive device view of a whole block of a CUDA arena not yet handed out by this
    /// set (V3 of [`DeviceView`] rests on this check).
    ///
    /// # Errors
    ///
    /// [`AllocError::AlreadyBorrowed`] if the block was handed out before; otherwise as
    /// [`Arena::device_view`].
    pub fn device_mut(&mut self, handle: Handle) -> Result<DeviceViewMut<'a>> {
        let view = self.arena.device_view(handle)?;
        self.claim(handle, true)?;
        Ok(DeviceViewMut {
            ptr: view.ptr,
            len: view.len,
            _arena: PhantomData,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_viewed_mutably_is_refused_any_other_view() {
        let mut arena = Arena::host(4096).unwrap();
        let (a, b) = (arena.alloc(64).unwrap(), arena.alloc(64).unwrap());
        let mut views = arena.views();
        views.get_mut::<f32>(a).unwrap();
        let again = views.get_mut::<f32>(a).unwrap_err();
        assert!(matches!(again, AllocError::AlreadyBorrowed { handle } if handle == a));
        let shared = views.get::<u8>(a).unwrap_err();
        assert!(matches!(shared, AllocError::AlreadyBorrowed { .. }));
        // A distinct block is still free to view.
        views.get_mut::<f32>(b).unwrap();
    }

    #[test]
    fn a_refused_view_claims_nothing() {
        let mut arena = Arena::host(4096).unwrap();
        let h = arena.alloc(6).unwrap();
        let mut views = arena.views();
        // 6 bytes are no whole number of f32.
        assert!(matches!(
            views.get_mut::<f32>(h),
            Err(AllocError::BadView { .. })
        ));
        views.get_mut::<u16>(h).unwrap();
    }

    #[cfg(feature = "cuda")]
    #[test]
    fn device_views_of_a_host_arena_are_refused_and_claim_nothing() {
        let mut arena = Arena::host(4096).unwrap();
        let h = arena.alloc(64).unwrap();
        let mut views = arena.views();
        assert!(matches!(
            views.device_mut(h),
            Err(AllocError::InvalidConfig { .. })
        ));
        assert!(matches!(
            views.device(h),
            Err(AllocError::InvalidConfig { .. })
        ));
        views.get_mut::<f32>(h).unwrap();
    }

    #[cfg(feature = "cuda")]
    fn view(ptr: u64, len: usize) -> DeviceView<'static> {
        // No device needed: a view is an address and a length, never dereferenced here.
        DeviceView {
            ptr,
            len,
            _arena: PhantomData,
        }
    }

    #[cfg(feature = "cuda")]
    #[test]
    fn a_range_offsets_the_address_by_whole_elements() {
        let sub = view(0x1000, 40).range::<f32>(2..7).unwrap();
        assert_eq!((sub.ptr(), sub.len()), (0x1000 + 8, 20));
        let empty = view(0x1000, 40).range::<f32>(10..10).unwrap();
        assert_eq!((empty.ptr(), empty.len()), (0x1000 + 40, 0));
        let mut_sub = DeviceViewMut {
            ptr: 0x2000,
            len: 16,
            _arena: PhantomData,
        }
        .range::<u16>(1..3)
        .unwrap();
        assert_eq!((mut_sub.ptr(), mut_sub.len()), (0x2002, 4));
    }

    #[cfg(feature = "cuda")]
    #[test]
    fn ranges_outside_the_view_reversed_or_misaligned_are_refused() {
        let bad = |r: Result<DeviceView<'_>>| matches!(r, Err(AllocError::BadRange { .. }));
        assert!(bad(view(0x1000, 40).range::<f32>(8..11)), "past the end");
        let reversed = Range { start: 5, end: 4 };
        assert!(bad(view(0x1000, 40).range::<f32>(reversed)), "reversed");
        assert!(
            bad(view(0x1000, 40).range::<f32>(0..usize::MAX)),
            "overflow"
        );
        assert!(bad(view(0x1002, 40).range::<f32>(0..1)), "misaligned");
        // A range of a range stays inside the first.
        let sub = view(0x1000, 40).range::<f32>(2..4).unwrap();
        assert!(bad(sub.range::<f32>(0..3)));
    }
}
