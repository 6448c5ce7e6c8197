//! Element views and carving a flat buffer into named views by a size table.
//!
//! [`View`] is what the model needs of a backend's memory view: its length and a split into
//! two disjoint views. `[T]` (host memory) and, with the `cuda` feature, the device views
//! implement it, so one `carve` serves both.

use std::ops::Range;

/// A view of consecutive 4-byte elements that can be measured and split without reading
/// them (a device view is never dereferenced on the host).
pub trait View {
    /// Elements in the view.
    fn len(&self) -> usize;

    /// True when the view has no elements.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Elements `..mid` and `mid..`.
    ///
    /// # Panics
    /// If `mid > self.len()`, as slice splitting does.
    fn split_at(&self, mid: usize) -> (&Self, &Self);

    /// The mutable twin of [`View::split_at`]: two disjoint mutable views.
    ///
    /// # Panics
    /// If `mid > self.len()`.
    fn split_at_mut(&mut self, mid: usize) -> (&mut Self, &mut Self);
}

impl<T> View for [T] {
    fn len(&self) -> usize {
        <[T]>::len(self)
    }
    fn split_at(&self, mid: usize) -> (&Self, &Self) {
        <[T]>::split_at(self, mid)
    }
    fn split_at_mut(&mut self, mid: usize) -> (&mut Self, &mut Self) {
        <[T]>::split_at_mut(self, mid)
    }
}

/// Elements `range` of `view`.
///
/// # Panics
/// If `range` is not within `0..view.len()`.
pub(crate) fn sub<S: View + ?Sized>(view: &S, range: Range<usize>) -> &S {
    assert!(range.start <= range.end, "{range:?} is reversed");
    view.split_at(range.end).0.split_at(range.start).1
}

/// The mutable twin of [`sub`].
///
/// # Panics
/// If `range` is not within `0..view.len()`.
pub(crate) fn sub_mut<S: View + ?Sized>(view: &mut S, range: Range<usize>) -> &mut S {
    assert!(range.start <= range.end, "{range:?} is reversed");
    view.split_at_mut(range.end).0.split_at_mut(range.start).1
}

/// Splits `buf` into `K` consecutive views of the given lengths (the rest, if any, is left
/// out). Callers pass lengths from a size table they already checked against `buf`.
///
/// # Panics
/// If the lengths add up to more than `buf.len()`.
pub(crate) fn carve<const K: usize, S: View + ?Sized>(mut buf: &S, lens: [usize; K]) -> [&S; K] {
    lens.map(|len| {
        let (head, tail) = buf.split_at(len);
        buf = tail;
        head
    })
}

/// The mutable twin of [`carve`]: `K` disjoint mutable views.
///
/// # Panics
/// If the lengths add up to more than `buf.len()`.
pub(crate) fn carve_mut<const K: usize, S: View + ?Sized>(
    buf: &mut S,
    lens: [usize; K],
) -> [&mut S; K] {
    let mut rest = Some(buf);
    lens.map(|len| {
        let (head, tail) = rest.take().map(|r| r.split_at_mut(len)).unzip();
        rest = tail;
        head.unwrap_or_else(|| unreachable!("refilled on every step"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_are_consecutive_and_disjoint() {
        let mut buf: Vec<f32> = (0..10).map(|i| i as f32).collect();
        let [a, b, c] = carve_mut(&mut buf[..], [2, 3, 4]);
        a[0] = -1.0;
        assert_eq!((b[0], c[3]), (2.0, 8.0));
        let [x, y] = carve(&buf[..], [1, 9]);
        assert_eq!((x, y[0]), (&[-1.0][..], 1.0));
    }

    #[test]
    fn sub_views_are_the_range() {
        let mut buf: Vec<f32> = (0..6).map(|i| i as f32).collect();
        assert_eq!(sub(&buf[..], 2..5), &[2.0, 3.0, 4.0]);
        sub_mut(&mut buf[..], 1..2)[0] = 9.0;
        assert_eq!(buf[1], 9.0);
        assert!(sub(&buf[..], 6..6).is_empty());
    }
}
