//! Element-wise passes split over the current rayon pool.
//!
//! Every element of these passes depends only on the same element of the inputs, so a split
//! changes no bit of the result. It pays on the large buffers (a GPT's tied embedding is most
//! of its elements): one thread streams a copy, a fill or an accumulation well below what two
//! threads draw from memory, and the rest of the step already runs on every thread of the
//! pool. Small spans run on the calling thread: a fork costs more than it saves.

use rayon::prelude::*;

/// Elements per task (256 KiB of f32): large enough that a task's fork is noise beside it.
const CHUNK: usize = 1 << 16;

/// Whether a pass over `len` elements is split.
fn splits(len: usize) -> bool {
    len >= 2 * CHUNK && rayon::current_num_threads() > 1
}

/// `f` over `dst`, chunk by chunk.
pub(super) fn each_mut<T: Send>(dst: &mut [T], f: impl Fn(&mut [T]) + Sync + Send) {
    if splits(dst.len()) {
        dst.par_chunks_mut(CHUNK).for_each(f);
    } else {
        f(dst);
    }
}

/// `f` over matching chunks of `dst` and `src` (of one length).
pub(super) fn zip_mut<T: Send, U: Sync>(
    dst: &mut [T],
    src: &[U],
    f: impl Fn(&mut [T], &[U]) + Sync + Send,
) {
    if splits(dst.len()) {
        dst.par_chunks_mut(CHUNK)
            .zip(src.par_chunks(CHUNK))
            .for_each(|(d, s)| f(d, s));
    } else {
        f(dst, src);
    }
}

/// As [`zip_mut`], returning whether `f` returned true on any chunk.
pub(super) fn zip_mut_any<T: Send, U: Sync>(
    dst: &mut [T],
    src: &[U],
    f: impl Fn(&mut [T], &[U]) -> bool + Sync + Send,
) -> bool {
    if splits(dst.len()) {
        dst.par_chunks_mut(CHUNK)
            .zip(src.par_chunks(CHUNK))
            .map(|(d, s)| f(d, s))
            .reduce(|| false, |a, b| a | b)
    } else {
        f(dst, src)
    }
}
