//! Copies between host values and arena blocks, through the arena's byte copies, so they
//! work on any arena with memory (host or CUDA) and the CPU tests run the path a GPU takes.
//! Checkpoint export and import go through here.

use super::error::{Error, Result};
use super::precision::{narrow, with_store, Precision};
use std::ops::Range;
use zero_alloc::{Arena, Handle};

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

/// Rounds `values` to `precision`'s storage type and writes them into block `h` from element
/// `at` on.
pub(crate) fn write_stored(
    arena: &mut Arena,
    precision: Precision,
    h: Handle,
    at: usize,
    values: &[f32],
) -> Result<()> {
    with_store!(precision, S => {
        let mut stored = vec![<S as bytemuck::Zeroable>::zeroed(); values.len()];
        narrow(values, &mut stored, 1.0);
        let offset = byte_offset(at, std::mem::size_of::<S>())?;
        arena.write_at(h, offset, bytemuck::cast_slice(&stored))?;
    });
    Ok(())
}
