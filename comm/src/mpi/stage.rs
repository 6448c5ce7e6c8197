//! Staging buffers owned by the backend, and the byte-level views and reductions over them.
//!
//! The buffers lie in one block lent from the rank's arena when the caller provided one
//! (`Communicator::provide_staging`), carved by the layout of `StagingRule::Copies`; a
//! collective larger than its region grows a heap buffer instead, counted as staged outside
//! the arena. Without a block, every buffer is on the heap.
//!
//! Decision: MPI only ever sees these buffers, never the caller's. A collective that times out
//! leaves its request pending, and MPI may still read or write its buffers later; because they
//! are ours, the backend leaks them (`Stage::abandon`) and returns the caller's slices intact,
//! which keeps the timeout sound. Rejected: handing user slices to MPI (one copy fewer), which
//! would make returning after a timeout a use-after-free in waiting.

use std::ptr::NonNull;

use zero_alloc::Lent;

use crate::communicator_staging::StagingLayout;
use crate::dtype::{BufMut, BufRef, DType};
use crate::element::Element;
use crate::reduce_op::{reduce_slices, ReduceOp};
use crate::with_element;

/// Words of a block lent from the rank's arena, carved by [`Stage::provide`].
#[derive(Debug, Clone, Copy)]
struct Region {
    start: NonNull<u64>,
    words: usize,
}

/// A byte buffer aligned for every element type (8-byte words): a region of the lent block
/// when the request fits it, else a heap vector grown to the high-water mark and counted.
#[derive(Debug, Default)]
pub(crate) struct Words {
    region: Option<Region>,
    heap: Vec<u64>,
    /// Where the last `ensure` placed the buffer, so the views read the same bytes.
    on_heap: bool,
}

// SAFETY: `region` points into the block of the `Lent` that the same `Stage` owns (a `Lent`
// is `Send`); the regions of one stage are disjoint, and each is only reached through
// `&mut Words` or `&Words`, so moving a `Words` to another thread moves its sole access.
unsafe impl Send for Words {}

impl Words {
    /// Makes room for `bytes` and returns the start; the contents are unspecified.
    pub(crate) fn ensure(&mut self, bytes: usize) -> *mut u8 {
        let words = bytes.div_ceil(8);
        match self.region {
            Some(r) if words <= r.words => {
                self.on_heap = false;
                r.start.as_ptr().cast()
            }
            _ => {
                if self.heap.len() < words {
                    // Exact, so the bytes counted outside the arena are the bytes held.
                    self.heap.reserve_exact(words - self.heap.len());
                    self.heap.resize(words, 0);
                }
                self.on_heap = true;
                self.heap.as_mut_ptr().cast()
            }
        }
    }

    fn held(&self) -> (*const u64, usize) {
        match self.region {
            Some(r) if !self.on_heap => (r.start.as_ptr().cast_const(), r.words),
            _ => (self.heap.as_ptr(), self.heap.len()),
        }
    }

    /// The first `bytes` bytes (after `ensure(bytes)`).
    pub(crate) fn bytes(&self, bytes: usize) -> &[u8] {
        let (start, words) = self.held();
        // SAFETY: `held` is a live region of `words` words (see `Region`'s `Send` argument) or
        // the heap vector; `&self` excludes writers through `ensure` or `bytes_mut`.
        let all = unsafe { std::slice::from_raw_parts(start, words) };
        &bytemuck::cast_slice(all)[..bytes]
    }

    /// The first `bytes` bytes, writable (after `ensure(bytes)`).
    pub(crate) fn bytes_mut(&mut self, bytes: usize) -> &mut [u8] {
        let (start, words) = self.held();
        // SAFETY: as in `bytes`; `&mut self` makes this the only access.
        let all = unsafe { std::slice::from_raw_parts_mut(start.cast_mut(), words) };
        &mut bytemuck::cast_slice_mut(all)[..bytes]
    }

    /// Heap bytes held, i.e. staged outside the lent block.
    pub(crate) fn outside_bytes(&self) -> u64 {
        self.heap.capacity() as u64 * 8
    }
}

/// Everything MPI may touch during one collective: data buffers and the count/displacement
/// arrays of the `v` collectives (MPI reads those until completion, too).
#[derive(Debug, Default)]
pub(crate) struct Stage {
    /// The rank's input (and, after phase 1, the gathered result).
    pub input: Words,
    /// What peers send this rank.
    pub output: Words,
    /// This rank's reduced chunk.
    pub mine: Words,
    /// Send counts, send displacements, receive counts, receive displacements (bytes, C ints).
    pub counts: Words,
    /// The arena block the regions lie in: held, never read through, so it stays mapped.
    block: Option<Lent<u64>>,
}

impl Stage {
    /// Carves `block` into the regions of `layout` (input, output, mine, counts, in that
    /// order) and frees the heap buffers. Returns the block back when it is smaller than the
    /// layout or a block was provided already.
    pub(crate) fn provide(
        &mut self,
        mut block: Lent<u64>,
        layout: StagingLayout,
    ) -> Result<(), (Lent<u64>, String)> {
        if self.block.is_some() {
            return Err((block, "a staging block was provided already".into()));
        }
        let words = |b: u64| usize::try_from(b.div_ceil(8)).unwrap_or(usize::MAX);
        let sizes = [
            words(layout.input),
            words(layout.output),
            words(layout.mine),
            words(layout.counts),
        ];
        let need = sizes.iter().try_fold(0usize, |a, &w| a.checked_add(w));
        let have = block.as_ref().len();
        if need.is_none_or(|n| n > have) {
            let what = format!(
                "a staging block of {} bytes for a layout of {} bytes",
                have * 8,
                layout.total()
            );
            return Err((block, what));
        }
        let base = block.as_mut().as_mut_ptr();
        let mut at = 0;
        for (words, buf) in sizes.into_iter().zip([
            &mut self.input,
            &mut self.output,
            &mut self.mine,
            &mut self.counts,
        ]) {
            // SAFETY: `at + words <= need <= have` (checked above), so the region lies inside
            // the block; regions follow each other, so they are disjoint.
            let start = unsafe { base.add(at) };
            buf.region = NonNull::new(start).map(|start| Region { start, words });
            buf.heap = Vec::new();
            buf.on_heap = false;
            at += words;
        }
        self.block = Some(block);
        Ok(())
    }

    /// Heap bytes held by the buffers, outside the lent block.
    pub(crate) fn outside_bytes(&self) -> u64 {
        [&self.input, &self.output, &self.mine, &self.counts]
            .iter()
            .map(|w| w.outside_bytes())
            .sum()
    }

    /// Gives the buffers up to a request that may still be pending: they are leaked with the
    /// lent block (which then stays pinned and mapped), and the next collective allocates
    /// fresh ones.
    pub(crate) fn abandon(&mut self) {
        std::mem::forget(std::mem::take(self));
    }
}

/// The bytes of a tagged buffer.
pub(crate) fn bytes_of<'a>(b: &'a BufRef<'_>) -> &'a [u8] {
    b.as_bytes()
}

/// The bytes of a tagged buffer, writable.
pub(crate) fn bytes_of_mut<'a>(b: &'a mut BufMut<'_>) -> &'a mut [u8] {
    b.as_bytes_mut()
}

fn reduce_typed<T: Element>(chunks: &[u8], out: &mut [u8], op: ReduceOp) {
    let out: &mut [T] = bytemuck::cast_slice_mut(out);
    let all: &[T] = bytemuck::cast_slice(chunks);
    if out.is_empty() {
        return;
    }
    let inputs: Vec<&[T]> = all.chunks_exact(out.len()).collect();
    reduce_slices(out, &inputs, op);
}

/// Reduces the consecutive equal chunks of `chunks` (one per rank, in rank order) into `out`
/// with the kernel the local backend uses, so results are bitwise the local backend's.
///
/// Both slices come from element-aligned storage (a `Words` or a typed user slice), and
/// `chunks.len()` is a multiple of `out.len()` by construction.
pub(crate) fn reduce_chunks(dtype: DType, chunks: &[u8], out: &mut [u8], op: ReduceOp) {
    with_element!(dtype, T => reduce_typed::<T>(chunks, out, op));
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;
    use zero_alloc::Arena;

    /// Input 32 bytes, output 64, mine 16, counts 32: 18 words.
    const LAYOUT: StagingLayout = StagingLayout {
        input: 32,
        output: 64,
        mine: 16,
        counts: 32,
    };

    /// A stage carved from an 18-word arena block, and the block's address range.
    fn provided(arena: &mut Arena) -> (Stage, std::ops::Range<usize>) {
        let h = arena.alloc_elems::<u64>(18).unwrap();
        let lent = arena.lend::<u64>(h).unwrap();
        let start = lent.as_ref().as_ptr() as usize;
        let mut stage = Stage::default();
        stage.provide(lent, LAYOUT).unwrap();
        (stage, start..start + 18 * 8)
    }

    #[test]
    fn buffers_within_the_layout_lie_in_the_block_in_order() {
        let mut arena = Arena::host(4096).unwrap();
        let (mut stage, block) = provided(&mut arena);
        let starts = [
            stage.input.ensure(32) as usize,
            stage.output.ensure(64) as usize,
            stage.mine.ensure(9) as usize,
            stage.counts.ensure(32) as usize,
        ];
        let offsets: Vec<usize> = starts.iter().map(|s| s - block.start).collect();
        assert_eq!(offsets, vec![0, 32, 96, 112]);
        stage.output.bytes_mut(64).fill(7);
        stage.input.bytes_mut(32).fill(3);
        assert!(
            stage.output.bytes(64).iter().all(|&b| b == 7),
            "regions overlap"
        );
        assert_eq!(stage.outside_bytes(), 0);
    }

    #[test]
    fn growth_beyond_a_region_is_counted_as_outside() {
        let mut arena = Arena::host(4096).unwrap();
        let (mut stage, block) = provided(&mut arena);
        let big = stage.mine.ensure(17) as usize;
        assert!(!block.contains(&big), "17 bytes do not fit mine's 16");
        assert_eq!(stage.outside_bytes(), 24, "three heap words");
        stage.mine.bytes_mut(17).fill(5);
        assert!(stage.mine.bytes(17).iter().all(|&b| b == 5));
        // Back within the region: the heap buffer is kept (high-water) and still counted.
        assert!(block.contains(&(stage.mine.ensure(16) as usize)));
        stage.input.ensure(100);
        assert_eq!(stage.outside_bytes(), 24 + 104);
    }

    #[test]
    fn a_block_smaller_than_the_layout_or_a_second_block_is_refused() {
        let mut arena = Arena::host(4096).unwrap();
        let h = arena.alloc_elems::<u64>(17).unwrap();
        let small = arena.lend::<u64>(h).unwrap();
        let mut stage = Stage::default();
        let (back, what) = stage.provide(small, LAYOUT).unwrap_err();
        assert!(what.contains("136 bytes"), "{what}");
        arena.take_back(back).unwrap();
        let (mut stage, _) = provided(&mut arena);
        let h = arena.alloc_elems::<u64>(18).unwrap();
        let second = arena.lend::<u64>(h).unwrap();
        assert!(stage.provide(second, LAYOUT).is_err());
        assert_eq!(stage.input.ensure(8) as usize % 8, 0);
    }

    #[test]
    fn without_a_block_every_buffer_is_on_the_heap_and_counted() {
        let mut stage = Stage::default();
        stage.input.ensure(10);
        stage.counts.ensure(16);
        assert_eq!(stage.outside_bytes(), 16 + 16);
    }

    #[test]
    fn byte_reduction_equals_the_typed_kernel_in_rank_order() {
        // Distinct values per rank and element: a wrong split of the bytes into ranks shows.
        let ranks: Vec<Vec<bf16>> = (0..3)
            .map(|r| {
                (0..5)
                    .map(|i| bf16::from_f32(1.0 + (i * 3 + r) as f32 / 7.0))
                    .collect()
            })
            .collect();
        let inputs: Vec<&[bf16]> = ranks.iter().map(Vec::as_slice).collect();
        let mut want = vec![bf16::ZERO; 5];
        reduce_slices(&mut want, &inputs, ReduceOp::Sum);

        let mut chunks = Words::default();
        chunks.ensure(30);
        let flat: Vec<bf16> = ranks.concat();
        chunks
            .bytes_mut(30)
            .copy_from_slice(bytemuck::cast_slice(&flat));
        let mut got = vec![bf16::ZERO; 5];
        let mut out = BufMut::Bf16(&mut got);
        reduce_chunks(
            DType::Bf16,
            chunks.bytes(30),
            bytes_of_mut(&mut out),
            ReduceOp::Sum,
        );
        assert_eq!(got, want);
    }
}
