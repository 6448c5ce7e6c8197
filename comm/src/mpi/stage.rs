//! Staging buffers owned by the backend, and the byte-level views and reductions over them.
//!
//! Decision: MPI only ever sees these buffers, never the caller's. A collective that times out
//! leaves its request pending, and MPI may still read or write its buffers later; because they
//! are ours, the backend leaks them (`Stage::abandon`) and returns the caller's slices intact,
//! which keeps the timeout sound. Rejected: handing user slices to MPI (one copy fewer), which
//! would make returning after a timeout a use-after-free in waiting.

use std::os::raw::c_int;

use bytemuck::Pod;

use crate::dtype::{BufMut, BufRef, DType, Element};
use crate::reduce_op::{reduce_slices, ReduceOp};

/// A growable byte buffer aligned for every element type (backed by `u64`).
#[derive(Debug, Default)]
pub(crate) struct Words(Vec<u64>);

impl Words {
    /// Grows to at least `bytes` and returns the start; the contents are unspecified.
    pub(crate) fn ensure(&mut self, bytes: usize) -> *mut u8 {
        let words = bytes.div_ceil(8);
        if self.0.len() < words {
            self.0.resize(words, 0);
        }
        self.0.as_mut_ptr().cast()
    }

    /// The first `bytes` bytes (after `ensure(bytes)`).
    pub(crate) fn bytes(&self, bytes: usize) -> &[u8] {
        &bytemuck::cast_slice(&self.0)[..bytes]
    }

    /// The first `bytes` bytes, writable (after `ensure(bytes)`).
    pub(crate) fn bytes_mut(&mut self, bytes: usize) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut(&mut self.0)[..bytes]
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
    /// Send counts, send displacements, receive counts, receive displacements (bytes).
    pub counts: Vec<c_int>,
}

impl Stage {
    /// Gives the buffers up to a request that may still be pending: they are leaked, and the
    /// next collective allocates fresh ones.
    pub(crate) fn abandon(&mut self) {
        std::mem::forget(std::mem::take(self));
    }
}

/// The bytes of a tagged buffer.
pub(crate) fn bytes_of<'a>(b: &'a BufRef<'_>) -> &'a [u8] {
    match b {
        BufRef::F32(s) => bytemuck::cast_slice(s),
        BufRef::Bf16(s) => bytemuck::cast_slice(s),
        BufRef::F16(s) => bytemuck::cast_slice(s),
    }
}

/// The bytes of a tagged buffer, writable.
pub(crate) fn bytes_of_mut<'a>(b: &'a mut BufMut<'_>) -> &'a mut [u8] {
    match b {
        BufMut::F32(s) => bytemuck::cast_slice_mut(s),
        BufMut::Bf16(s) => bytemuck::cast_slice_mut(s),
        BufMut::F16(s) => bytemuck::cast_slice_mut(s),
    }
}

fn reduce_typed<T: Element + Pod>(chunks: &[u8], out: &mut [u8], op: ReduceOp) {
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
    match dtype {
        DType::F32 => reduce_typed::<f32>(chunks, out, op),
        DType::Bf16 => reduce_typed::<half::bf16>(chunks, out, op),
        DType::F16 => reduce_typed::<half::f16>(chunks, out, op),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

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
