//! How a unit's flat buffer is split across the data-parallel ranks.
//!
//! Every unit (embeddings, one transformer block, the final LayerNorm, ...) is one flat buffer.
//! It is padded to a multiple of `world * align` elements and cut into `world` equal shards;
//! rank `r` owns shard `r` of every unit. Equal shards keep reduce-scatter and all-gather per
//! unit free of uneven slicing (the rejected alternative, uneven `numel / world` splits, needs
//! variable-count collectives that NCCL does not have).
//!
//! This module is the only place shard offsets are computed: everything else asks a
//! [`Partition`] for a [`Shard`].

use crate::error::{Error, Result};

/// A contiguous range `[offset, offset + len)` of a unit's (padded) flat buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Shard {
    /// First element of the range.
    pub offset: usize,
    /// Number of elements in the range.
    pub len: usize,
}

impl Shard {
    /// One past the last element.
    pub fn end(&self) -> usize {
        self.offset + self.len
    }

    /// The part of `self` that also lies in `other`. When they are disjoint the result is
    /// empty, placed where it can slice either range's buffer (at most both ends).
    pub fn intersect(&self, other: Shard) -> Shard {
        let start = self.offset.max(other.offset);
        let end = self.end().min(other.end());
        Shard {
            offset: start.min(end),
            len: end.saturating_sub(start),
        }
    }

    /// The range as a `std::ops::Range`, for slicing.
    pub fn range(&self) -> std::ops::Range<usize> {
        self.offset..self.end()
    }
}

/// Most ranks the workspace's tools start (`zero-train --world-size`, `zero-bench --ranks`):
/// the local backend runs each as a thread, and every rank keeps per-peer tables.
pub const MAX_RANKS: usize = 1024;

/// The split of one unit of `numel` elements across `world` ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Partition {
    numel: usize,
    world: usize,
    shard_len: usize,
}

impl Partition {
    /// Splits `numel` elements across `world` ranks, each shard a multiple of `align` elements.
    ///
    /// `align` lets shards start on an arena-aligned boundary (e.g. 64 f32 = 256 bytes).
    ///
    /// # Errors
    /// [`Error::ZeroWorld`] or [`Error::ZeroAlign`] when `world` or `align` is zero,
    /// [`Error::PartitionOverflow`] when the padded size overflows.
    pub fn new(numel: usize, world: usize, align: usize) -> Result<Self> {
        if world == 0 {
            return Err(Error::ZeroWorld);
        }
        if align == 0 {
            return Err(Error::ZeroAlign);
        }
        let quantum = world.checked_mul(align).ok_or(Error::PartitionOverflow {
            numel,
            world,
            align,
        })?;
        let padded =
            numel
                .div_ceil(quantum)
                .checked_mul(quantum)
                .ok_or(Error::PartitionOverflow {
                    numel,
                    world,
                    align,
                })?;
        Ok(Self {
            numel,
            world,
            shard_len: padded / world,
        })
    }

    /// Elements of real data in the unit.
    pub fn numel(&self) -> usize {
        self.numel
    }

    /// Number of ranks the unit is split across.
    pub fn world(&self) -> usize {
        self.world
    }

    /// Elements in the padded unit (`world * shard_len`).
    pub fn padded_numel(&self) -> usize {
        self.shard_len * self.world
    }

    /// Elements in every rank's shard, padding included.
    pub fn shard_len(&self) -> usize {
        self.shard_len
    }

    /// Rank `rank`'s shard of the padded buffer.
    ///
    /// # Panics
    /// When `rank >= world`: a rank outside the group is a programming error, not input.
    pub fn shard(&self, rank: usize) -> Shard {
        assert!(
            rank < self.world,
            "rank {rank} outside a world of {}",
            self.world
        );
        Shard {
            offset: rank * self.shard_len,
            len: self.shard_len,
        }
    }

    /// `window` (a part of rank `rank`'s shard, possibly empty) in the coordinates of a
    /// buffer holding the whole padded unit (`whole`) or only that rank's shard.
    pub fn local(&self, rank: usize, window: Shard, whole: bool) -> std::ops::Range<usize> {
        if window.len == 0 {
            return 0..0;
        }
        let base = if whole { 0 } else { self.shard(rank).offset };
        window.offset - base..window.end() - base
    }

    /// The real (unpadded) elements of rank `rank`'s shard; may be empty for the last ranks.
    pub fn data_shard(&self, rank: usize) -> Shard {
        self.shard(rank).intersect(Shard {
            offset: 0,
            len: self.numel,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_divisible_unit_needs_no_padding() {
        let p = Partition::new(12, 4, 1).unwrap();
        assert_eq!(p.padded_numel(), 12);
        assert_eq!(p.shard(2), Shard { offset: 6, len: 3 });
    }

    #[test]
    fn the_last_shard_carries_the_padding() {
        // 10 elements over 4 ranks with 2-element alignment: padded to 16, shards of 4.
        let p = Partition::new(10, 4, 2).unwrap();
        assert_eq!(p.shard_len(), 4);
        assert_eq!(p.data_shard(2), Shard { offset: 8, len: 2 });
        assert_eq!(p.data_shard(3).len, 0);
    }

    #[test]
    fn zero_ranks_is_an_error() {
        assert!(matches!(Partition::new(5, 0, 1), Err(Error::ZeroWorld)));
        assert!(matches!(Partition::new(5, 1, 0), Err(Error::ZeroAlign)));
        assert!(matches!(
            Partition::new(usize::MAX, 2, 1),
            Err(Error::PartitionOverflow { .. })
        ));
    }

    proptest! {
        /// Every element of the unit is owned by exactly one rank, shards are equal and aligned.
        #[test]
        fn shards_cover_every_element_once(numel in 0usize..5000, world in 1usize..=9, align in 1usize..=64) {
            let p = Partition::new(numel, world, align).unwrap();
            let mut owner = vec![usize::MAX; p.padded_numel()];
            for r in 0..world {
                let s = p.shard(r);
                prop_assert_eq!(s.len % align, 0);
                prop_assert_eq!(s.len, p.shard_len());
                for o in &mut owner[s.range()] {
                    prop_assert_eq!(*o, usize::MAX, "element owned twice");
                    *o = r;
                }
                let d = p.data_shard(r);
                prop_assert!(d.end() <= numel, "an empty shard must still slice the unit");
                prop_assert!(d.len == 0 || d.offset == s.offset);
            }
            prop_assert!(owner.iter().all(|&o| o != usize::MAX));
            let data: usize = (0..world).map(|r| p.data_shard(r).len).sum();
            prop_assert_eq!(data, numel);
            // Padding is less than one quantum.
            prop_assert!(p.padded_numel() - numel < world * align);
        }
    }
}
