//! Staging memory: what a backend copies collectives through, how many bytes that takes for
//! collectives up to a size, and how the owner of a rank's memory hands those bytes over.
//!
//! Decision: the rule is a plain value ([`StagingRule`]) that a planner can hold without a
//! communicator, so a rank's memory plan counts the backend's staging before anything is
//! allocated. The bytes arrive as one block lent from the rank's arena
//! ([`Communicator::provide_staging`]); a collective larger than the block falls back to the
//! heap and is counted ([`Communicator::staging_outside_bytes`]), so nothing is silently
//! outside. Rejected: the backend allocating from the arena itself, which would make
//! zero-comm own the arena and its cap.

use zero_alloc::Lent;

use crate::communicator::{lock, Communicator};
use crate::dtype::DType;
use crate::error::{CommError, Result};

/// The largest element any collective moves, in bytes.
const WIDEST_ELEMENT: u64 = DType::WIDEST as u64;

/// How a backend stages collectives, as a function of the largest collective's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StagingRule {
    /// The backend reads and writes the callers' buffers in place (the local backend).
    #[default]
    None,
    /// The backend copies every collective through buffers of its own (the MPI backend):
    /// the rank's input, what peers send it, its reduced chunk and the per-rank counts of the
    /// `v` collectives, at least `floor_bytes` of input and `floor_bytes` per rank of output
    /// (the descriptor exchange of `Config::debug_checks`).
    Copies {
        /// Ranks in the group.
        ranks: usize,
        /// Bytes of the descriptor exchange per rank (0 without debug checks).
        floor_bytes: u64,
    },
}

/// The bytes of each staging buffer for collectives up to some size, each a whole number of
/// 8-byte words, in the order they are carved from the lent block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StagingLayout {
    /// The rank's staged input (and the gathered result of all-reduce and reduce).
    pub input: u64,
    /// What peers send this rank.
    pub output: u64,
    /// This rank's reduced chunk.
    pub mine: u64,
    /// Send/receive counts and displacements of the `v` collectives (4 C ints per rank).
    pub counts: u64,
}

impl StagingLayout {
    /// Bytes of all the buffers together.
    pub fn total(&self) -> u64 {
        self.input + self.output + self.mine + self.counts
    }
}

fn round_up(bytes: u64, to: u64) -> Option<u64> {
    bytes.checked_next_multiple_of(to)
}

impl StagingRule {
    /// The buffers for collectives of at most `largest_collective_bytes` (whole arrays:
    /// the gathered result of an all-gather, the input of a reduce-scatter), or `None` on
    /// overflow.
    ///
    /// Reduce and all-reduce receive one chunk of the array from every rank, chunks of at most
    /// `ceil(n / ranks)` elements, so `ranks` chunks are the array rounded up to a multiple of
    /// `ranks` elements: at most the bytes rounded up to `ranks` of the widest elements (a
    /// multiple of the rounding for every narrower type).
    pub fn layout(&self, largest_collective_bytes: u64) -> Option<StagingLayout> {
        let StagingRule::Copies { ranks, floor_bytes } = *self else {
            return Some(StagingLayout::default());
        };
        let p = u64::try_from(ranks.max(1)).ok()?;
        let chunks = round_up(largest_collective_bytes, WIDEST_ELEMENT.checked_mul(p)?)?;
        let input = largest_collective_bytes.max(floor_bytes);
        let output = chunks.max(floor_bytes.checked_mul(p)?);
        let counts = 4 * std::mem::size_of::<std::os::raw::c_int>() as u64 * p;
        Some(StagingLayout {
            input: round_up(input, 8)?,
            output: round_up(output, 8)?,
            mine: round_up(chunks / p, 8)?,
            counts: round_up(counts, 8)?,
        })
    }

    /// Bytes of [`StagingRule::layout`] together (0 for [`StagingRule::None`]).
    pub fn bytes(&self, largest_collective_bytes: u64) -> Option<u64> {
        self.layout(largest_collective_bytes).map(|l| l.total())
    }
}

impl Communicator {
    /// How this communicator's backend stages collectives.
    pub fn staging_rule(&self) -> StagingRule {
        lock(&self.inner).backend.staging_rule()
    }

    /// Bytes of staging the backend needs for collectives of at most
    /// `largest_collective_bytes` (0 for a backend that stages nothing), or `None` on
    /// overflow.
    pub fn staging_bytes(&self, largest_collective_bytes: u64) -> Option<u64> {
        self.staging_rule().bytes(largest_collective_bytes)
    }

    /// Hands the backend `block` (at least [`Communicator::staging_bytes`] of
    /// `largest_collective_bytes`) to stage collectives in, for good; staging it held on the
    /// heap before is freed. Waits for the operations issued before it.
    ///
    /// The block stays with the backend: a backend that abandons its buffers to a collective
    /// that timed out leaks the loan, so the block stays pinned and mapped.
    ///
    /// # Errors
    /// [`CommError::InvalidArgument`] for a backend that stages nothing, a block smaller than
    /// the layout, or a second block; the group's error when it is broken. The block is then
    /// dropped, which leaves it pinned in its arena.
    pub fn provide_staging(&self, block: Lent<u64>, largest_collective_bytes: u64) -> Result<()> {
        self.drain();
        let mut inner = lock(&self.inner);
        let Some(layout) = inner
            .backend
            .staging_rule()
            .layout(largest_collective_bytes)
        else {
            return Err(CommError::InvalidArgument {
                what: format!(
                    "staging for collectives of {largest_collective_bytes} bytes overflows"
                ),
            });
        };
        if layout.total() == 0 {
            return Err(CommError::InvalidArgument {
                what: format!("the {} backend stages nothing", inner.backend.name()),
            });
        }
        inner.backend.provide_staging(block, layout)
    }

    /// Bytes the backend holds for staging outside the block it was given (heap buffers grown
    /// for collectives larger than the block, or all of its staging when it was given none).
    pub fn staging_outside_bytes(&self) -> u64 {
        lock(&self.inner).backend.staging_outside_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes each MPI buffer grows to, counted element by element: for every dtype and
    /// every array of at most `largest` bytes, the input, the chunks peers send (the most any
    /// rank receives) and the rank's own chunk.
    fn naive_high_water(ranks: usize, largest: u64) -> (u64, u64, u64) {
        let (mut input, mut output, mut mine) = (0u64, 0u64, 0u64);
        for es in [2u64, 4, 8] {
            for n in 0..=largest / es {
                input = input.max(n * es);
                for r in 0..ranks as u64 {
                    // Rank r's chunk of n elements, counted element by element.
                    let owned = (0..n)
                        .filter(|&i| {
                            let lo = r * n / ranks as u64;
                            let hi = (r + 1) * n / ranks as u64;
                            (lo..hi).contains(&i)
                        })
                        .count() as u64;
                    mine = mine.max(owned * es);
                    output = output.max(owned * es * ranks as u64);
                }
            }
        }
        (input, output, mine)
    }

    #[test]
    fn the_mpi_layout_covers_every_buffer_it_grows_to() {
        for ranks in 1..=5 {
            for largest in 0..=97u64 {
                let rule = StagingRule::Copies {
                    ranks,
                    floor_bytes: 0,
                };
                let l = rule.layout(largest).unwrap();
                let (input, output, mine) = naive_high_water(ranks, largest);
                let words = |b: u64| b.div_ceil(8) * 8;
                assert!(l.input >= input && l.output >= output && l.mine >= mine);
                assert_eq!(l.counts, 16 * ranks as u64);
                if largest % (DType::WIDEST as u64 * ranks as u64) == 0 {
                    // Arrays that split evenly: the bound is reached.
                    let naive = (words(input), words(output), words(mine));
                    assert_eq!(
                        (l.input, l.output, l.mine),
                        naive,
                        "{ranks} ranks, {largest} B"
                    );
                }
            }
        }
    }

    #[test]
    fn debug_checks_raise_small_layouts_to_the_descriptor_exchange() {
        let rule = StagingRule::Copies {
            ranks: 3,
            floor_bytes: 48,
        };
        let l = rule.layout(8).unwrap();
        assert_eq!((l.input, l.output), (48, 144));
        assert_eq!(rule.bytes(8), Some(48 + 144 + 8 + 48));
    }

    #[test]
    fn no_staging_needs_no_bytes_and_overflow_is_none() {
        assert_eq!(StagingRule::None.bytes(u64::MAX), Some(0));
        let rule = StagingRule::Copies {
            ranks: 4,
            floor_bytes: 0,
        };
        assert_eq!(rule.bytes(u64::MAX), None);
    }
}
