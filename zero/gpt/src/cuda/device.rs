//! Device memory views that fit [`crate::Backend`]'s unsized `Slice` and `Ids` types.
//!
//! Invariant: a `&DeviceSlice` is a fat pointer whose address is a CUDA device address and
//! whose length is an element count; it is never dereferenced on the host. Its element type
//! is a zero-sized, 4-byte-aligned slot, so the Rust slice it wraps spans zero bytes: any
//! non-null aligned address makes a valid reference, and the view's length travels with it
//! for free. (Rejected: a `[f32]` holding a device address, which Rust may assume it can
//! read.) Views are made only from borrows that keep the memory alive for the view's
//! lifetime and make a `&mut` view unique:
//! - a cudarc `CudaSlice` (`of`, `of_mut`): shared views from `&CudaSlice`, mutable ones from
//!   `&mut CudaSlice`;
//! - a zero-alloc arena block or element range (`from_view`, `from_view_mut`), whose
//!   guarantees V1 to V3 (bounds, lifetime, aliasing: see `zero_alloc::DeviceView`) give the
//!   same: shared views from a `DeviceView`, mutable ones from the unique `DeviceViewMut`;
//! - a block lent from an arena (`from_lent`, `from_lent_mut`): the loan pins the block, so
//!   the arena neither views, moves nor frees it and the `LentDevice` is the only access to
//!   it, and the loan holds the arena's device memory; views borrow the loan, shared or
//!   mutably.
//!
//! Ordering: a view is made before the kernel that uses it is launched, so it must not record
//! cudarc's read/write events (they would mark a point before the kernel). `of` and `of_mut`
//! take slices of untracked contexts only (`zero_alloc::context::untracked_context`,
//! asserted), whose pointer guards record nothing; arena views and loans carry a bare address
//! and record nothing either. Kernels on the view's stream see the memory by stream order,
//! and other streams order themselves by that module's O1 to O3.

use std::ops::Range;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use zero_alloc::{DeviceView, DeviceViewMut, LentDevice};

/// A zero-sized stand-in for one 4-byte device element.
#[derive(Debug)]
#[repr(C)]
pub struct Slot([u32; 0]);

/// `addr`, or a dangling aligned address for an empty allocation whose address is 0: a
/// view of no elements is never passed to a kernel that reads it. The one rule for empty
/// views: `of`, `of_mut` and `empty` all go through it, so no view is ever made at address 0.
///
/// # Panics
/// On a null address with a non-zero length (cudarc never hands one out).
fn non_null(addr: u64, len: usize) -> u64 {
    if addr != 0 {
        return addr;
    }
    assert_eq!(len, 0, "null device address for {len} elements");
    std::mem::align_of::<Slot>() as u64
}

/// The (address, element count) of a view of `bytes` bytes at `addr` in elements of
/// `elem` bytes, through `non_null` for an empty one.
///
/// # Panics
/// On a length that is no whole number of elements, or a null address with a non-zero
/// length.
fn elements(addr: u64, bytes: usize, elem: usize) -> (u64, usize) {
    assert_eq!(
        bytes % elem,
        0,
        "a device block of {bytes} bytes is no whole number of {elem}-byte elements"
    );
    (non_null(addr, bytes / elem), bytes / elem)
}

/// Panics unless `ctx` has cudarc's event tracking off (see the module's ordering note).
fn assert_untracked(ctx: &CudaContext) {
    assert!(
        !ctx.is_event_tracking(),
        "device views need a context from zero_alloc::context::untracked_context: \
         cudarc's events would be recorded when the view is made, before its kernel runs"
    );
}

macro_rules! device_view {
    ($(#[$doc:meta])* $name:ident, $elem:ty) => {
        $(#[$doc])*
        #[derive(Debug)]
        #[repr(transparent)]
        pub struct $name([Slot]);

        impl $name {
            /// A view of `len` elements at device address `addr`.
            ///
            /// # Safety
            /// `addr` must be a non-zero multiple of 4 and, for the lifetime `'a`, the start
            /// of `len` live device elements that nothing else writes while the view is
            /// used (or reads, for a `&mut` view).
            ///
            /// # Panics
            /// On an address of 0 or one not a multiple of 4 (for no elements, use
            /// [`Self::empty`]).
            pub unsafe fn from_raw<'a>(addr: u64, len: usize) -> &'a mut Self {
                // A null or misaligned reference is undefined behaviour even to zero bytes;
                // two compares per view turn a broken caller into a panic instead.
                assert!(
                    addr != 0 && addr % std::mem::align_of::<Slot>() as u64 == 0,
                    "device view at address {addr:#x}: must be non-zero and 4-aligned"
                );
                let ptr = std::ptr::slice_from_raw_parts_mut(addr as usize as *mut Slot, len);
                // SAFETY: Slot is zero-sized with alignment 4, so the slice spans no bytes;
                // the caller guarantees addr is non-null and 4-aligned, which is all a
                // reference to zero bytes needs. $name is repr(transparent) over [Slot], so
                // the cast keeps the fat pointer's metadata.
                unsafe { &mut *(ptr as *mut Self) }
            }

            /// A view of no elements (at `non_null`'s dangling aligned address), for a
            /// buffer that has no allocation.
            #[must_use]
            pub fn empty<'a>() -> &'a mut Self {
                // SAFETY: `non_null(0, 0)` is non-zero and 4-aligned, and a view of no
                // elements covers no device memory, so nothing can alias or outlive it.
                unsafe { Self::from_raw(non_null(0, 0), 0) }
            }

            /// A read-only view of `s` for kernels launched on `stream`. It records no event
            /// and waits for none: `s`'s writers are ordered before those kernels by stream
            /// order (see the module's ordering note).
            ///
            /// # Panics
            /// If `s`'s context has cudarc's event tracking on.
            pub fn of<'a>(s: &'a CudaSlice<$elem>, stream: &'a CudaStream) -> &'a Self {
                assert_untracked(s.context());
                // Untracked: the guard neither waits nor records, it only lends the address.
                let (addr, _no_event) = s.device_ptr(stream);
                let addr = non_null(addr, s.len());
                // SAFETY: cudarc allocations are 256-byte aligned (non_null handles the empty
                // one) and hold
                // s.len() elements; the returned view borrows `s` immutably, so the memory
                // lives and is not written through cudarc while the view exists.
                unsafe { Self::from_raw(addr, s.len()) }
            }

            /// A mutable view of `s` (see [`Self::of`]).
            ///
            /// # Panics
            /// As [`Self::of`].
            pub fn of_mut<'a>(s: &'a mut CudaSlice<$elem>, stream: &'a CudaStream) -> &'a mut Self {
                assert_untracked(s.context());
                let len = s.len();
                let (addr, _no_event) = s.device_ptr_mut(stream);
                let addr = non_null(addr, len);
                // SAFETY: as in `of`, and the view borrows `s` mutably, so it is unique.
                unsafe { Self::from_raw(addr, len) }
            }

            /// A read-only view of an arena block (or element range of one) for as long as
            /// `v` borrows the arena.
            ///
            /// # Panics
            /// If `v` is no whole number of elements or its address is not 4-aligned.
            #[must_use]
            pub fn from_view<'a>(v: DeviceView<'a>) -> &'a Self {
                let (addr, len) = elements(v.ptr(), v.len(), std::mem::size_of::<$elem>());
                // SAFETY: V1 of `DeviceView`: `len` elements of one live block at `addr`
                // (non-null, alignment asserted by from_raw); V2: it stays for 'a, the view's
                // borrow of the arena; V3: nothing writes it through a shared view.
                unsafe { Self::from_raw(addr, len) }
            }

            /// A mutable view of an arena block (or element range of one) for as long as
            /// `v` borrows the arena.
            ///
            /// # Panics
            /// As [`Self::from_view`].
            #[must_use]
            pub fn from_view_mut<'a>(v: DeviceViewMut<'a>) -> &'a mut Self {
                let (addr, len) = elements(v.ptr(), v.len(), std::mem::size_of::<$elem>());
                // SAFETY: V1 and V2 as in `from_view`; V3: a `DeviceViewMut` is the only view
                // of its bytes, and it is consumed here.
                unsafe { Self::from_raw(addr, len) }
            }

            /// A read-only view of a whole lent block, borrowing the loan.
            ///
            /// # Panics
            /// As [`Self::from_view`].
            #[must_use]
            pub fn from_lent(l: &LentDevice) -> &Self {
                let (addr, len) = elements(l.ptr(), l.len(), std::mem::size_of::<$elem>());
                // SAFETY: the loan's block (see the module's list): `len` elements at `addr`,
                // pinned so nothing else views, moves or frees it, its memory held by `l`,
                // which the view borrows shared.
                unsafe { Self::from_raw(addr, len) }
            }

            /// A mutable view of a whole lent block, borrowing the loan mutably.
            ///
            /// # Panics
            /// As [`Self::from_view`].
            #[must_use]
            pub fn from_lent_mut(l: &mut LentDevice) -> &mut Self {
                let (addr, len) = elements(l.ptr(), l.len(), std::mem::size_of::<$elem>());
                // SAFETY: as in `from_lent`; the loan is the only access to the block and the
                // view borrows it mutably, so the view is unique.
                unsafe { Self::from_raw(addr, len) }
            }

            /// Elements in the view.
            #[must_use]
            pub fn len(&self) -> usize {
                self.0.len()
            }

            /// True when the view has no elements.
            #[must_use]
            pub fn is_empty(&self) -> bool {
                self.0.is_empty()
            }

            /// The device address of the first element.
            #[must_use]
            pub fn addr(&self) -> u64 {
                self.0.as_ptr() as usize as u64
            }

            /// The sub-view of elements `range`.
            ///
            /// # Panics
            /// If `range` is not within `0..self.len()`, as slice indexing does.
            #[must_use]
            pub fn range(&self, range: Range<usize>) -> &Self {
                assert!(range.start <= range.end && range.end <= self.len(), "{range:?} out of 0..{}", self.len());
                let addr = self.addr() + (range.start * std::mem::size_of::<$elem>()) as u64;
                // SAFETY: the sub-range lies inside this view's elements (asserted), whose
                // address is 4-aligned, and it borrows self immutably.
                unsafe { Self::from_raw(addr, range.len()) }
            }

            /// The mutable sub-view of elements `range`.
            ///
            /// # Panics
            /// If `range` is not within `0..self.len()`.
            #[must_use]
            pub fn range_mut(&mut self, range: Range<usize>) -> &mut Self {
                assert!(range.start <= range.end && range.end <= self.len(), "{range:?} out of 0..{}", self.len());
                let addr = self.addr() + (range.start * std::mem::size_of::<$elem>()) as u64;
                // SAFETY: as in `range`, and it borrows self mutably, so it is unique.
                unsafe { Self::from_raw(addr, range.len()) }
            }
        }

        // Reflexive, so `&view` and `&mut view` meet `Gpt::forward`'s `AsRef` / `AsMut`
        // bounds as `&[f32]` does on the CPU.
        impl AsRef<$name> for $name {
            fn as_ref(&self) -> &Self {
                self
            }
        }

        impl AsMut<$name> for $name {
            fn as_mut(&mut self) -> &mut Self {
                self
            }
        }

        impl crate::backend::View for $name {
            fn len(&self) -> usize {
                self.0.len()
            }

            fn split_at(&self, mid: usize) -> (&Self, &Self) {
                (self.range(0..mid), self.range(mid..self.len()))
            }

            fn split_at_mut(&mut self, mid: usize) -> (&mut Self, &mut Self) {
                let (addr, len) = (self.addr(), self.len());
                assert!(mid <= len, "split at {mid} out of 0..={len}");
                let tail = addr + (mid * std::mem::size_of::<$elem>()) as u64;
                // SAFETY: `..mid` and `mid..` are disjoint parts of this view's elements
                // (asserted), both 4-aligned, and both borrow self mutably, so each is unique.
                unsafe { (Self::from_raw(addr, mid), Self::from_raw(tail, len - mid)) }
            }
        }
    };
}

device_view!(
    /// f32 elements in device memory: the CUDA backend's `Slice`.
    DeviceSlice,
    f32
);
device_view!(
    /// u32 token ids in device memory: the CUDA backend's `Ids`.
    DeviceIds,
    u32
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_carry_address_and_length_and_sub_views_offset_the_address() {
        // No device needed: the view is never dereferenced, so any aligned address works.
        // SAFETY: 0x1000 is non-null and aligned; nothing is read through the view.
        let view = unsafe { DeviceSlice::from_raw(0x1000, 10) };
        assert_eq!((view.addr(), view.len()), (0x1000, 10));
        let sub = view.range(3..7);
        assert_eq!((sub.addr(), sub.len()), (0x1000 + 12, 4));
        assert!(view.range(10..10).is_empty());
    }

    #[test]
    fn splits_give_disjoint_views_at_offset_addresses() {
        use crate::backend::View;
        // SAFETY: as above.
        let view = unsafe { DeviceSlice::from_raw(0x1000, 10) };
        let (head, tail) = View::split_at_mut(view, 4);
        assert_eq!((head.addr(), head.len()), (0x1000, 4));
        assert_eq!((tail.addr(), tail.len()), (0x1000 + 16, 6));
        let (a, b) = View::split_at(&*tail, 6);
        assert_eq!((a.len(), b.len(), b.addr()), (6, 0, 0x1000 + 40));
    }

    #[test]
    fn an_empty_allocation_at_address_zero_gets_an_aligned_dangling_address() {
        assert_eq!(non_null(0, 0), 4);
        assert_eq!(non_null(0x100, 3), 0x100);
    }

    #[test]
    fn arena_views_become_whole_elements_and_empty_ones_a_non_null_address() {
        assert_eq!(elements(0x1000, 40, 4), (0x1000, 10));
        assert_eq!(elements(0, 0, 4), (4, 0));
    }

    #[test]
    #[should_panic(expected = "no whole number of 4-byte elements")]
    fn an_arena_view_of_a_partial_element_panics() {
        let _ = elements(0x1000, 6, 4);
    }

    #[test]
    fn empty_views_have_no_elements_at_a_non_null_aligned_address() {
        let (f, ids) = (DeviceSlice::empty(), DeviceIds::empty());
        assert_eq!((f.len(), f.addr()), (0, 4));
        assert_eq!((ids.len(), ids.addr()), (0, 4));
    }

    #[test]
    #[should_panic(expected = "must be non-zero and 4-aligned")]
    fn a_view_at_address_zero_panics_rather_than_making_a_null_reference() {
        // SAFETY: deliberately broken (address 0); `from_raw` must refuse it.
        let _ = unsafe { DeviceSlice::from_raw(0, 0) };
    }

    #[test]
    #[should_panic(expected = "out of 0..4")]
    fn sub_views_past_the_end_panic() {
        // SAFETY: as above.
        let view = unsafe { DeviceIds::from_raw(0x2000, 4) };
        let _ = view.range(2..5);
    }
}
