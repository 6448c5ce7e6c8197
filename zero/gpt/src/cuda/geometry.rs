//! Launch geometry of every kernel, computed from shapes: pure functions, no CUDA needed.
//!
//! Legend: B batch, T sequence, C channels, NH heads, N = B*T rows, OC output channels,
//! Vp padded vocabulary.
//!
//! Each function returns the grid, block and dynamic shared memory its kernel's comment in
//! `kernels/*.cu` states. Products of user-sized dimensions are checked: a shape whose grid
//! would pass CUDA's limit (2^31 - 1 blocks in x) is an error, never a wrapped launch. A
//! grid of 0 blocks means "nothing to do": the backend skips the launch (CUDA rejects it).

use crate::{GptError, Result};

/// Threads per block of the one-thread-per-element kernels.
pub const ELEMENTWISE_BLOCK: u32 = 256;
/// Rows per block of the warp-per-row LayerNorm kernels (block = 32 * 8 = 256).
pub const LAYERNORM_ROWS_PER_BLOCK: u32 = 8;
/// Rows per block of the warp-per-row attention softmax kernels (block = 32 * 8 = 256).
pub const SOFTMAX_ROWS_PER_BLOCK: u32 = 8;
/// Rows per block of the warp-per-row cross-entropy forward (block = 32 * 4 = 128).
pub const CROSSENTROPY_ROWS_PER_BLOCK: u32 = 4;
/// CUDA's limit on `gridDim.x`.
pub const MAX_GRID_X: usize = (1 << 31) - 1;

/// A 1-D launch: `grid` blocks of `block` threads with `shared_bytes` of dynamic shared memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Blocks (`gridDim.x`); 0 when there is no work.
    pub grid: u32,
    /// Threads per block (`blockDim.x`).
    pub block: u32,
    /// Dynamic shared memory per block, in bytes.
    pub shared_bytes: u32,
}

impl Geometry {
    /// True when the launch has no blocks and must be skipped.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.grid == 0
    }
}

/// `a * b`, or [`GptError::LaunchTooLarge`] naming `what` when it overflows usize.
pub fn checked_product(kernel: &'static str, what: &'static str, dims: &[usize]) -> Result<usize> {
    dims.iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or(GptError::LaunchTooLarge {
            kernel,
            what,
            value: usize::MAX,
            limit: usize::MAX,
        })
}

/// `value` as the u32 a kernel argument takes.
pub fn as_u32(kernel: &'static str, what: &'static str, value: usize) -> Result<u32> {
    u32::try_from(value).map_err(|_| GptError::LaunchTooLarge {
        kernel,
        what,
        value,
        limit: u32::MAX as usize,
    })
}

/// ceil(items / per_block) blocks of `block` threads.
fn blocks(kernel: &'static str, items: usize, per_block: u32, block: u32) -> Result<Geometry> {
    let grid = items.div_ceil(per_block as usize);
    if grid > MAX_GRID_X {
        return Err(GptError::LaunchTooLarge {
            kernel,
            what: "grid blocks",
            value: grid,
            limit: MAX_GRID_X,
        });
    }
    Ok(Geometry {
        grid: grid as u32, // <= MAX_GRID_X < 2^31, checked above
        block,
        shared_bytes: 0,
    })
}

/// One thread per element of `items` elements (every `1 thread / element` kernel).
pub fn per_element(kernel: &'static str, items: usize) -> Result<Geometry> {
    blocks(kernel, items, ELEMENTWISE_BLOCK, ELEMENTWISE_BLOCK)
}

/// One thread per element of a product of dimensions, e.g. (N, C).
pub fn per_element_of(kernel: &'static str, dims: &[usize]) -> Result<Geometry> {
    per_element(kernel, checked_product(kernel, "elements", dims)?)
}

/// One warp per row, `rows_per_block` rows per block.
pub fn warp_per_row(kernel: &'static str, rows: usize, rows_per_block: u32) -> Result<Geometry> {
    blocks(kernel, rows, rows_per_block, 32 * rows_per_block)
}

/// `layernorm_forward` / `layernorm_backward_input`: one warp per row of N.
pub fn layernorm_rows(kernel: &'static str, n: usize) -> Result<Geometry> {
    warp_per_row(kernel, n, LAYERNORM_ROWS_PER_BLOCK)
}

/// `crossentropy_forward`: one warp per row of N.
pub fn crossentropy_forward(n: usize) -> Result<Geometry> {
    warp_per_row("crossentropy_forward", n, CROSSENTROPY_ROWS_PER_BLOCK)
}

/// `attention_softmax_forward` / `attention_softmax_backward`: one warp per (b, h, t) row.
pub fn attention_softmax_rows(
    kernel: &'static str,
    b: usize,
    nh: usize,
    t: usize,
) -> Result<Geometry> {
    let rows = checked_product(kernel, "softmax rows", &[b, nh, t])?;
    warp_per_row(kernel, rows, SOFTMAX_ROWS_PER_BLOCK)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every element index below `items` is covered by exactly one thread of the launch.
    fn covers(g: Geometry, items: usize, per_block: usize) -> bool {
        let threads = g.grid as usize * per_block;
        threads >= items && threads < items + per_block
    }

    #[test]
    fn per_element_grids_cover_every_element_once() {
        for items in [1, 255, 256, 257, 768 * 1024, 50_304 * 4096] {
            let g = per_element("k", items).unwrap();
            assert_eq!(g.block, 256);
            assert!(covers(g, items, 256), "{items}: {g:?}");
        }
        assert!(per_element("k", 0).unwrap().is_empty());
    }

    #[test]
    fn warp_per_row_puts_rows_per_block_warps_in_a_block() {
        let g = layernorm_rows("layernorm_forward", 4096 + 1).unwrap();
        assert_eq!((g.block, g.grid), (256, 513));
        let g = crossentropy_forward(9).unwrap();
        assert_eq!((g.block, g.grid), (128, 3));
    }

    #[test]
    fn attention_softmax_launches_one_warp_per_row() {
        let g = attention_softmax_rows("attention_softmax_forward", 4, 12, 1024).unwrap();
        assert_eq!(g.block, 256);
        assert_eq!(g.grid, 4 * 12 * 1024 / 8);
        let g = attention_softmax_rows("attention_softmax_backward", 1, 1, 9).unwrap();
        assert_eq!(g.grid, 2);
    }

    #[test]
    fn grids_past_cuda_limits_are_errors_not_wrapped_launches() {
        let too_many = (MAX_GRID_X + 1) * 256;
        assert!(matches!(
            per_element("residual_forward", too_many),
            Err(GptError::LaunchTooLarge {
                what: "grid blocks",
                ..
            })
        ));
        assert!(matches!(
            per_element_of("k", &[usize::MAX, 2]),
            Err(GptError::LaunchTooLarge {
                what: "elements",
                ..
            })
        ));
        assert!(matches!(
            as_u32("k", "c", 1 << 32),
            Err(GptError::LaunchTooLarge { value, .. }) if value == 1 << 32
        ));
        assert!(attention_softmax_rows("k", usize::MAX / 2, 2, 2).is_err());
    }
}
