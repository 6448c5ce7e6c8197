//! The set of free ranges: best-fit lookup by size, coalescing by address.
//!
//! Two ordered indexes of the same ranges: by offset (to find neighbours when a range is
//! returned) and by (size, offset) (to find the smallest hole that fits). A single sorted
//! vector would make best-fit O(n); a segregated-size list would not be exact best-fit.

use std::collections::{BTreeMap, BTreeSet};

#[derive(Debug, Default, Clone)]
pub(crate) struct FreeList {
    by_offset: BTreeMap<usize, usize>,
    by_size: BTreeSet<(usize, usize)>,
    total: usize,
}

impl FreeList {
    /// A free list holding one range `[0, capacity)` (or nothing for a zero capacity).
    pub(crate) fn new(capacity: usize) -> Self {
        let mut list = Self::default();
        if capacity > 0 {
            list.insert_raw(0, capacity);
        }
        list
    }

    pub(crate) fn total(&self) -> usize {
        self.total
    }

    pub(crate) fn largest(&self) -> usize {
        self.by_size.last().map_or(0, |&(size, _)| size)
    }

    pub(crate) fn ranges(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.by_offset.iter().map(|(&o, &s)| (o, s))
    }

    /// Takes `size` bytes from the start of the smallest hole that fits; returns its offset.
    pub(crate) fn take_best_fit(&mut self, size: usize) -> Option<usize> {
        let &(hole, offset) = self.by_size.range((size, 0)..).next()?;
        self.remove_raw(offset, hole);
        if hole > size {
            self.insert_raw(offset + size, hole - size);
        }
        Some(offset)
    }

    /// Takes `size` bytes from the end of the highest hole that fits; returns their offset.
    /// Blocks that live briefly beside the long-lived ones at the bottom (buffers lent to an
    /// operation in flight) stack up from the top this way, so their holes are refilled by
    /// their successors instead of splitting the free space below.
    pub(crate) fn take_highest_fit(&mut self, size: usize) -> Option<usize> {
        let (&hole, &len) = self.by_offset.iter().rev().find(|&(_, &len)| len >= size)?;
        self.remove_raw(hole, len);
        if len > size {
            self.insert_raw(hole, len - size);
        }
        Some(hole + len - size)
    }

    /// Returns `[offset, offset + size)`, merging it with adjacent free ranges.
    pub(crate) fn release(&mut self, mut offset: usize, mut size: usize) {
        if let Some((&prev, &prev_size)) = self.by_offset.range(..offset).next_back() {
            debug_assert!(
                prev + prev_size <= offset,
                "released range overlaps a free one"
            );
            if prev + prev_size == offset {
                self.remove_raw(prev, prev_size);
                offset = prev;
                size += prev_size;
            }
        }
        if let Some(&next_size) = self.by_offset.get(&(offset + size)) {
            self.remove_raw(offset + size, next_size);
            size += next_size;
        }
        self.insert_raw(offset, size);
    }

    /// Replaces the contents with the given non-overlapping, non-adjacent ranges.
    pub(crate) fn rebuild(&mut self, ranges: impl IntoIterator<Item = (usize, usize)>) {
        *self = Self::default();
        for (offset, size) in ranges {
            if size > 0 {
                self.release(offset, size);
            }
        }
    }

    fn insert_raw(&mut self, offset: usize, size: usize) {
        self.by_offset.insert(offset, size);
        self.by_size.insert((size, offset));
        self.total += size;
    }

    fn remove_raw(&mut self, offset: usize, size: usize) {
        self.by_offset.remove(&offset);
        self.by_size.remove(&(size, offset));
        self.total -= size;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_fit_picks_smallest_sufficient_hole() {
        let mut list = FreeList::default();
        list.release(0, 100);
        list.release(200, 30);
        list.release(300, 50);
        assert_eq!(list.take_best_fit(40), Some(300));
        assert_eq!(list.take_best_fit(30), Some(200));
        assert_eq!(list.take_best_fit(200), None);
    }

    #[test]
    fn highest_fit_takes_the_end_of_the_highest_hole_that_fits() {
        let mut list = FreeList::default();
        list.release(0, 100);
        list.release(200, 30);
        list.release(300, 50);
        assert_eq!(list.take_highest_fit(40), Some(310));
        assert_eq!(
            list.take_highest_fit(40),
            Some(60),
            "300..310 and 200..230 are too small"
        );
        assert_eq!(list.take_highest_fit(10), Some(300));
        assert_eq!(list.take_highest_fit(100), None);
        assert_eq!(list.total(), 100 + 30 + 50 - 90);
    }

    #[test]
    fn release_coalesces_both_neighbours() {
        let mut list = FreeList::default();
        list.release(0, 10);
        list.release(20, 10);
        list.release(10, 10);
        assert_eq!(list.ranges().collect::<Vec<_>>(), vec![(0, 30)]);
        assert_eq!(list.largest(), 30);
        assert_eq!(list.total(), 30);
    }
}
