//! Copies between host values and arena blocks, through the arena's byte copies, so they
//! work on any arena with memory (host or CUDA) and the CPU tests run the path a GPU takes.
//! Checkpoint export and import go through here.

use super::error::{Error, Result};
use super::precision::{narrow, with_store, Precision};
use std::ops::Range;
use zero_alloc::{Arena, Handle};
use zero_comm::F32Element;

/// The byte offset of element `at` of a `size`-byte type, checked.
fn byte_offset(at: usize, size: usize) -> Result<usize> {
    at.checked_mul(size)
        .ok_or_else(|| Error::Order(format!("element {at} overflows a byte offset")))
}

/// Elements `range` of f32 block `h`, copied to the host.
pub(crate) fn read_f32(arena: &Arena, h: Handle, range: Range<usize>) -> Result<Vec<f32>> {
    let mut out = vec![0f32; range.end.saturating_sub(range.start)];
    let offset = byte_offset(range.start, 4)?;
    arena.read_at(h, offset, bytemuck::cast_slice_mut(&mut out))?;
    Ok(out)
}

/// Writes `values` into f32 block `h` from element `at` on.
pub(crate) fn write_f32(arena: &mut Arena, h: Handle, at: usize, values: &[f32]) -> Result<()> {
    let offset = byte_offset(at, 4)?;
    Ok(arena.write_at(h, offset, bytemuck::cast_slice(values))?)
}

/// `values` rounded to `precision`'s storage type, as bytes.
pub(crate) fn stored_bytes(precision: Precision, values: &[f32]) -> Vec<u8> {
    with_store!(precision, S => {
        let mut stored = vec![<S as bytemuck::Zeroable>::zeroed(); values.len()];
        narrow(values, &mut stored, 1.0);
        bytemuck::cast_slice(&stored).to_vec()
    })
}

/// Stored `bytes` of `precision`'s storage type, widened to f32.
pub(crate) fn stored_values(precision: Precision, bytes: &[u8]) -> Vec<f32> {
    with_store!(precision, S => {
        let mut stored = vec![<S as bytemuck::Zeroable>::zeroed(); bytes.len() / std::mem::size_of::<S>()];
        bytemuck::cast_slice_mut::<S, u8>(&mut stored).copy_from_slice(bytes);
        stored.iter().map(|&x| F32Element::to_f32(x)).collect()
    })
}
