//! The local collectives: each rank works on its own share, reading peers' buffers in place.
//!
//! Every reduction reads the N inputs in rank order 0..N-1 and accumulates in the type's
//! accumulator (f32 for the f32 family), so results are bitwise identical whatever the timing. All-reduce is literally reduce-scatter's phase
//! followed by all-gather's phase over the same chunks.
//!
//! Soundness argument shared by every function here: the caller passed the entry wait, so
//! every slot holds a live buffer of the agreed length (descriptors compared), and each owner
//! stays inside its call until the final committed wait. Within a phase, the ranges written
//! (by exactly one rank) and the ranges read by others are disjoint, as noted per phase.

use crate::chunk::chunk;
use crate::dtype::DType;
use crate::error::Result;
use crate::op::OpDesc;
use crate::reduce_op::{reduce_raw, ReduceOp};
use crate::with_element;

use super::group::{Addr, Entered, Member};

fn at(a: Addr, elems: usize, dtype: DType) -> *mut u8 {
    std::ptr::with_exposed_provenance_mut::<u8>(a.0 + elems * dtype.size())
}

/// Reduces `inputs` into `out` (`len` elements of `dtype`).
///
/// # Safety
/// As [`reduce_raw`], for every pointer.
unsafe fn reduce_any(dtype: DType, out: *mut u8, inputs: &[*mut u8], len: usize, op: ReduceOp) {
    fn cast<T>(v: &[*mut u8]) -> Vec<*const T> {
        v.iter().map(|p| p.cast_const().cast::<T>()).collect()
    }
    with_element!(dtype, T => {
        // SAFETY: forwarded from the caller; the casts match `dtype`, which all ranks agreed
        // on, and the communicator checked that `op` supports it.
        unsafe { reduce_raw::<T>(out.cast(), &cast(inputs), len, op) }
    });
}

/// Copies `len` elements unless source and destination coincide.
///
/// # Safety
/// `src` readable and `dst` writable for `len` elements, not overlapping unless equal, and
/// no other thread writes either range during the call.
unsafe fn copy(dtype: DType, src: *const u8, dst: *mut u8, len: usize) {
    if src != dst.cast_const() {
        // SAFETY: forwarded from the caller.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, len * dtype.size()) };
    }
}

fn dtype_of(desc: &OpDesc) -> DType {
    desc.dtype.unwrap_or(DType::F32)
}

/// Phase "reduce my chunk": chunk `r` of every input into `out`.
fn reduce_chunk(e: &Entered, dt: DType, lo: usize, hi: usize, out: *mut u8, op: ReduceOp) {
    let inputs: Vec<*mut u8> = e.slots.iter().map(|s| at(s.send, lo, dt)).collect();
    // SAFETY: module soundness argument. In this phase only the rank that owns chunk
    // [lo, hi) writes it (into `out`), and no rank reads another rank's chunk.
    unsafe { reduce_any(dt, out, &inputs, hi - lo, op) };
}

/// All-reduce = reduce-scatter's phase + all-gather's phase over chunks of the array.
pub(crate) fn all_reduce(m: &Member, desc: &OpDesc, e: &Entered, op: ReduceOp) -> Result<()> {
    let (n, size, r, dt) = (desc.count, m.group.size, m.rank, dtype_of(desc));
    let (lo, hi) = chunk(n, size, r);
    reduce_chunk(e, dt, lo, hi, at(e.slots[r].recv, lo, dt), op);
    m.exit(desc)?;
    for j in (0..size).filter(|&j| j != r) {
        let (lo, hi) = chunk(n, size, j);
        // SAFETY: rank j's chunk j was finished in phase 1 and nobody writes it now; rank r
        // alone writes its own chunk j.
        unsafe {
            copy(
                dt,
                at(e.slots[j].recv, lo, dt),
                at(e.slots[r].recv, lo, dt),
                hi - lo,
            )
        };
    }
    m.exit(desc)
}

/// Rank r gets chunk r (`count / size` elements) of the reduction.
pub(crate) fn reduce_scatter(m: &Member, desc: &OpDesc, e: &Entered, op: ReduceOp) -> Result<()> {
    let (size, r, dt) = (m.group.size, m.rank, dtype_of(desc));
    let per = desc.count / size;
    let mine = &e.slots[r];
    let out = if mine.in_place {
        at(mine.recv, r * per, dt)
    } else {
        at(mine.recv, 0, dt)
    };
    reduce_chunk(e, dt, r * per, (r + 1) * per, out, op);
    m.exit(desc)
}

/// Rank r's recv gets every rank's chunk (in-place: `send` points at the rank's own chunk).
pub(crate) fn all_gather(m: &Member, desc: &OpDesc, e: &Entered) -> Result<()> {
    let (size, r, dt) = (m.group.size, m.rank, dtype_of(desc));
    let per = desc.count / size;
    for j in 0..size {
        // SAFETY: inputs are only read in this phase; rank r alone writes its recv, and an
        // in-place rank's own chunk is its input (skipped by `copy` as src == dst).
        unsafe {
            copy(
                dt,
                at(e.slots[j].send, 0, dt),
                at(e.slots[r].recv, j * per, dt),
                per,
            )
        };
    }
    m.exit(desc)
}

/// Every rank copies the root's input into its recv.
pub(crate) fn broadcast(m: &Member, desc: &OpDesc, e: &Entered, root: usize) -> Result<()> {
    let (r, dt) = (m.rank, dtype_of(desc));
    // SAFETY: the root's input is only read in this phase (in-place root: src == dst, no
    // copy); rank r alone writes its recv.
    unsafe {
        copy(
            dt,
            at(e.slots[root].send, 0, dt),
            at(e.slots[r].recv, 0, dt),
            desc.count,
        )
    };
    m.exit(desc)
}

/// Rank r reduces chunk r of every input into chunk r of the root's recv.
pub(crate) fn reduce(
    m: &Member,
    desc: &OpDesc,
    e: &Entered,
    op: ReduceOp,
    root: usize,
) -> Result<()> {
    let (n, size, r, dt) = (desc.count, m.group.size, m.rank, dtype_of(desc));
    let (lo, hi) = chunk(n, size, r);
    reduce_chunk(e, dt, lo, hi, at(e.slots[root].recv, lo, dt), op);
    m.exit(desc)
}
