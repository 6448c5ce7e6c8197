//! The copy plan for moving a block down over itself in memory that has no memmove (device
//! memory: a `cuMemcpy` of overlapping ranges is undefined).
//!
//! Moving `len` bytes from `src` down to `dst` (`distance = src - dst`) in ascending chunks is
//! correct when each chunk is read whole before the write that may overlap it, and every later
//! chunk's source lies above every earlier chunk's destination. Two ways keep that:
//!
//! 1. **Direct**: chunks no longer than `distance`, copied straight from source to
//!    destination; a chunk's two ranges cannot overlap, and its destination covers only
//!    bytes of chunks already copied. `len / distance` copies.
//! 2. **Staged**: chunks of `scratch_len`, each copied source -> scratch, then scratch ->
//!    destination. The scratch lies outside the region, so neither copy overlaps; the write
//!    of chunk `k` ends at `dst + (k + 1) * scratch_len`, below chunk `k + 1`'s source at
//!    `src + (k + 1) * scratch_len`. `2 * len / scratch_len` copies.
//!
//! The plan takes the way with fewer copies: direct when `2 * distance >= scratch_len`.
//! (Rejected: always direct, which moved 100 MB down by 256 B in ~400k copies.) Executed in
//! order on one stream, each copy completes before the next starts.

/// One end of a copy: an offset in the region, or the start of the scratch buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum At {
    /// A byte offset in the region being defragmented.
    Region(usize),
    /// The start of the scratch buffer (outside the region).
    Scratch,
}

/// One copy of `len` bytes from `from` to `to`; the two ranges never overlap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Copy {
    pub(crate) from: At,
    pub(crate) to: At,
    pub(crate) len: usize,
}

/// The copies that move `len` bytes from `src` down to `dst` (`dst < src`), in the order they
/// must run, staging through a scratch buffer of `scratch_len` bytes when that takes fewer
/// copies (see the module's steps 1 and 2).
///
/// # Panics
/// If `dst >= src`.
pub(crate) fn plan_move_down(
    src: usize,
    dst: usize,
    len: usize,
    scratch_len: usize,
) -> impl Iterator<Item = Copy> {
    assert!(dst < src, "a move down needs dst {dst} < src {src}");
    let distance = src - dst;
    let staged = 2 * distance < scratch_len;
    let chunk = if staged { scratch_len } else { distance };
    (0..len.div_ceil(chunk)).flat_map(move |k| {
        let (done, n) = (k * chunk, chunk.min(len - k * chunk));
        let (from, to) = (At::Region(src + done), At::Region(dst + done));
        let steps = if staged {
            [
                Some(Copy {
                    from,
                    to: At::Scratch,
                    len: n,
                }),
                Some(Copy {
                    from: At::Scratch,
                    to,
                    len: n,
                }),
            ]
        } else {
            [Some(Copy { from, to, len: n }), None]
        };
        steps.into_iter().flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Runs `plan` on a host region and scratch with `copy_from_slice`, which (unlike
    /// `copy_within`) needs disjoint ranges: a step whose ranges overlap fails the test.
    fn execute(region: &mut [u8], scratch: &mut [u8], plan: impl Iterator<Item = Copy>) {
        for step in plan {
            let n = step.len;
            match (step.from, step.to) {
                (At::Region(s), At::Region(d)) => {
                    assert!(s + n <= d || d + n <= s, "overlapping step {step:?}");
                    let bytes = region[s..s + n].to_vec();
                    region[d..d + n].copy_from_slice(&bytes);
                }
                (At::Region(s), At::Scratch) => scratch[..n].copy_from_slice(&region[s..s + n]),
                (At::Scratch, At::Region(d)) => region[d..d + n].copy_from_slice(&scratch[..n]),
                (At::Scratch, At::Scratch) => panic!("scratch to scratch step {step:?}"),
            }
        }
    }

    /// `plan_move_down` executed on a patterned region equals `copy_within` on a copy of it.
    fn check(dst: usize, distance: usize, len: usize, scratch_len: usize) {
        let src = dst + distance;
        let pattern: Vec<u8> = (0..src + len + 7).map(|i| (i * 31 + 7) as u8).collect();
        let mut expected = pattern.clone();
        expected.copy_within(src..src + len, dst);
        let mut region = pattern;
        let mut scratch = vec![0; scratch_len];
        execute(
            &mut region,
            &mut scratch,
            plan_move_down(src, dst, len, scratch_len),
        );
        assert_eq!(region, expected, "dst {dst} distance {distance} len {len}");
    }

    #[test]
    fn a_small_distance_is_staged_through_the_scratch_in_few_copies() {
        let (len, scratch) = (100 << 20, 4 << 20);
        let plan: Vec<Copy> = plan_move_down(256, 0, len, scratch).collect();
        // 100 MiB in 4 MiB chunks: 25 chunks, 2 copies each (the old plan made 409,600).
        assert_eq!(plan.len(), 2 * len.div_ceil(scratch));
        assert_eq!(plan.iter().map(|c| c.len).sum::<usize>(), 2 * len);
    }

    #[test]
    fn a_large_distance_copies_directly_in_distance_sized_chunks() {
        let plan: Vec<Copy> = plan_move_down(3 << 20, 0, 10 << 20, 4 << 20).collect();
        assert_eq!(plan.len(), 4);
        assert!(plan
            .iter()
            .all(|c| matches!((c.from, c.to), (At::Region(_), At::Region(_)))));
    }

    #[test]
    fn without_a_scratch_the_plan_is_direct() {
        check(5, 3, 100, 0);
        assert_eq!(plan_move_down(3, 0, 100, 0).count(), 34);
    }

    #[test]
    fn an_empty_move_has_no_copies() {
        assert_eq!(plan_move_down(10, 0, 0, 64).count(), 0);
    }

    proptest! {
        #[test]
        fn any_plan_moves_like_copy_within(
            dst in 0usize..64,
            distance in 1usize..300,
            len in 0usize..2_000,
            scratch_len in 0usize..600,
        ) {
            check(dst, distance, len, scratch_len);
        }
    }
}
