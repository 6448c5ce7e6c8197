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
/// Rows each thread of a column reduction's first stage sums (one chunk). Fixed, so the
/// order of the additions, and with it the result, depends only on the shape.
pub const COLUMN_CHUNK_ROWS: usize = 64;
/// Columns per block of a column reduction's first stage: 8 warps, each 32 adjacent columns.
pub const COLUMN_BLOCK: u32 = 256;

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

/// The two launches of a deterministic column reduction over a (rows, cols) matrix.
///
/// Stage 1 (`partials`): block `k * col_blocks + cb` sums, for the [`COLUMN_BLOCK`] columns
/// `cb * 256 ..`, rows `k * COLUMN_CHUNK_ROWS ..` of chunk `k`, one thread per column, into
/// `partials[k * cols + j]`; `col_blocks = ceil(cols / 256)`. Stage 2 (`finish`): one thread
/// per column adds the `chunks` partials in chunk order. Empty when there are no rows or no
/// columns (the `+=` then leaves the gradient as it is, as the CPU does).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ColumnReduce {
    /// Stage 1: `col_blocks * chunks` blocks of [`COLUMN_BLOCK`] threads.
    pub partials: Geometry,
    /// Stage 2: one thread per column.
    pub finish: Geometry,
    /// Row chunks: ceil(rows / [`COLUMN_CHUNK_ROWS`]).
    pub chunks: usize,
    /// f32 partial sums one reduced quantity needs: `chunks * cols`.
    pub partials_len: usize,
}

/// The geometry of a column reduction of `rows` x `cols`, overflow-checked.
pub fn column_reduce(kernel: &'static str, rows: usize, cols: usize) -> Result<ColumnReduce> {
    if rows == 0 || cols == 0 {
        let none = Geometry {
            grid: 0,
            block: COLUMN_BLOCK,
            shared_bytes: 0,
        };
        return Ok(ColumnReduce {
            partials: none,
            finish: none,
            chunks: 0,
            partials_len: 0,
        });
    }
    let chunks = rows.div_ceil(COLUMN_CHUNK_ROWS);
    let col_blocks = cols.div_ceil(COLUMN_BLOCK as usize);
    let partials = blocks(
        kernel,
        checked_product(kernel, "partial blocks", &[col_blocks, chunks])?,
        1,
        COLUMN_BLOCK,
    )?;
    Ok(ColumnReduce {
        partials,
        finish: per_element(kernel, cols)?,
        chunks,
        partials_len: checked_product(kernel, "partials", &[chunks, cols])?,
    })
}

/// `encoder_backward_wte_grouped`: one block of [`ELEMENTWISE_BLOCK`] threads per distinct
/// token, the threads over channels.
pub fn block_per_group(kernel: &'static str, groups: usize) -> Result<Geometry> {
    blocks(kernel, groups, 1, ELEMENTWISE_BLOCK)
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
    fn column_reduce_covers_every_column_of_every_chunk_once() {
        for (rows, cols) in [(1, 1), (64, 256), (65, 257), (16 * 1024, 3 * 768), (33, 24)] {
            let g = column_reduce("bias_backward", rows, cols).unwrap();
            let (chunks, col_blocks) = (rows.div_ceil(64), cols.div_ceil(256));
            assert_eq!(g.chunks, chunks);
            // Block k * col_blocks + cb covers columns cb*256.. of chunk k: each (chunk,
            // column) pair exactly once, and the last chunk holds the leftover rows.
            let mut seen = vec![0u8; chunks * cols];
            for block in 0..g.partials.grid as usize {
                let (k, cb) = (block / col_blocks, block % col_blocks);
                for tid in 0..g.partials.block as usize {
                    let j = cb * 256 + tid;
                    if j < cols {
                        seen[k * cols + j] += 1;
                    }
                }
            }
            assert!(seen.iter().all(|&s| s == 1), "{rows}x{cols}");
            assert_eq!(g.partials_len, chunks * cols);
            assert!(covers(g.finish, cols, 256));
            assert!((chunks - 1) * COLUMN_CHUNK_ROWS < rows && rows <= chunks * 64);
        }
        // GPT-2 124M, B = 16, T = 1024, the widest bias (4C): 3,145,728 bytes of partials.
        let g = column_reduce("bias_backward", 16 * 1024, 4 * 768).unwrap();
        assert_eq!((g.chunks, 4 * g.partials_len), (256, 3_145_728));
        let empty = column_reduce("bias_backward", 0, 768).unwrap();
        assert!(empty.partials.is_empty() && empty.finish.is_empty());
        assert_eq!(empty.partials_len, 0);
    }

    #[test]
    fn column_reduce_and_groups_past_cuda_limits_are_errors() {
        assert!(column_reduce("k", usize::MAX, usize::MAX).is_err());
        // 2^31 blocks of partials: one past gridDim.x.
        assert!(column_reduce("k", (MAX_GRID_X + 1) * 64, 1).is_err());
        assert!(column_reduce("k", MAX_GRID_X * 64, 1).is_ok());
        assert!(block_per_group("k", MAX_GRID_X + 1).is_err());
        assert_eq!(block_per_group("k", 5).unwrap().grid, 5);
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
