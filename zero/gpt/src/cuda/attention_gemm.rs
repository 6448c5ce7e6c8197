//! Causal attention as cuBLAS strided-batched products over the B*NH (batch row, head)
//! pairs, with the backend's scratch layout: pure data, tested on the CPU.
//!
//! Legend: B batch, T sequence, C channels, NH heads, hs = C/NH.
//!
//! The CUDA backend permutes q, k, v out of qkv (B,T,3,NH,hs) into (B,NH,T,hs) each, so every
//! (b, h) pair's q, k, v are contiguous row-major (T,hs) matrices and its scores a row-major
//! (T,T) matrix, one fixed stride apart. As in [`super::gemm`], a row-major product X = A·B
//! is computed column-major as Xᵀ = Bᵀ·Aᵀ. The scale 1/sqrt(hs) is applied by the softmax
//! kernels, not by alpha, as the CPU kernel scales the dot product. The caller's `att`
//! (B,T,NH,T) is not one stride per pair (its rows of one pair are NH*T apart and its pairs
//! T or T*NH*T apart), so the backward first permutes it into the scores scratch.

use super::geometry::checked_product;
use crate::{GptError, Result};

const KERNEL: &str = "cublasGemmStridedBatchedEx";

/// A region of the attention scratch ([`AttentionScratch`]) a batched product reads or
/// writes. Each holds B*NH matrices, (T,hs) or (T,T), row-major, one after the other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Region {
    /// Queries (B,NH,T,hs).
    Q,
    /// Keys (B,NH,T,hs).
    K,
    /// Values (B,NH,T,hs).
    V,
    /// The output before the heads are merged (forward), or `dout` split into heads
    /// (backward): (B,NH,T,hs).
    Y,
    /// Scores, softmax weights, d(att) or d(score), by step: (B,NH,T,T).
    Scores,
    /// Gradients of Q, K, V: (B,NH,T,hs) each.
    DQ,
    /// See [`Region::DQ`].
    DK,
    /// See [`Region::DQ`].
    DV,
}

/// The shape of one attention call, every dimension checked to fit cuBLAS's `int`. Made
/// only by [`AttentionShape::new`], so the products below never see an unchecked shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionShape {
    /// Batch B.
    pub(super) b: usize,
    /// Sequence T.
    pub(super) t: usize,
    /// Heads NH.
    pub(super) nh: usize,
    /// Head size hs = C/NH.
    pub(super) hs: usize,
}

fn int(what: &'static str, value: usize) -> Result<i32> {
    i32::try_from(value).map_err(|_| GptError::LaunchTooLarge {
        kernel: KERNEL,
        what,
        value,
        limit: i32::MAX as usize,
    })
}

impl AttentionShape {
    /// Checks that T, hs, the batch count B*NH and each per-pair matrix (T*T, T*hs) fit an
    /// `int`, and that the whole scratch fits a usize (strides are 64-bit in cuBLAS).
    ///
    /// # Errors
    /// [`GptError::LaunchTooLarge`] naming the first dimension that does not fit.
    ///
    /// # Panics
    /// When `nh` is 0 or does not divide `c` (the CPU kernel's contract).
    pub fn new(b: usize, t: usize, c: usize, nh: usize) -> Result<Self> {
        assert!(
            nh > 0 && c % nh == 0,
            "c = {c} is not a multiple of nh = {nh}"
        );
        let shape = Self {
            b,
            t,
            nh,
            hs: c / nh,
        };
        int("T", t)?;
        int("hs", shape.hs)?;
        int("B*NH", checked_product(KERNEL, "B*NH", &[b, nh])?)?;
        int("T*T", checked_product(KERNEL, "T*T", &[t, t])?)?;
        int("T*hs", checked_product(KERNEL, "T*hs", &[t, shape.hs])?)?;
        AttentionScratch::new(shape)?;
        Ok(shape)
    }
}

/// Offsets (in f32 elements) of each [`Region`] in the backend's attention scratch, and its
/// length: 7 (B,NH,T,hs) regions and one (B,NH,T,T), i.e. 7*B*T*C + B*NH*T*T floats.
/// Q, K, V are adjacent (one permute writes all three), and so are DQ, DK, DV.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionScratch {
    /// Elements of one (B,NH,T,hs) region (B*T*C).
    pub heads: usize,
    /// Elements in all.
    pub len: usize,
}

impl AttentionScratch {
    /// The layout for `shape`.
    ///
    /// # Errors
    /// [`GptError::LaunchTooLarge`] when the length overflows a usize.
    pub fn new(shape: AttentionShape) -> Result<Self> {
        let AttentionShape { b, t, nh, hs } = shape;
        let heads = checked_product(KERNEL, "B*T*C", &[b, nh, t, hs])?;
        let scores = checked_product(KERNEL, "B*NH*T*T", &[b, nh, t, t])?;
        let len = heads
            .checked_mul(7)
            .and_then(|h| h.checked_add(scores))
            .ok_or(GptError::LaunchTooLarge {
                kernel: KERNEL,
                what: "attention scratch elements",
                value: usize::MAX,
                limit: usize::MAX,
            })?;
        Ok(Self { heads, len })
    }

    /// Where `region` starts.
    #[must_use]
    pub fn offset(&self, region: Region) -> usize {
        let slot = match region {
            Region::Q => 0,
            Region::K => 1,
            Region::V => 2,
            Region::Y => 3,
            Region::DQ => 4,
            Region::DK => 5,
            Region::DV => 6,
            Region::Scores => 7,
        };
        slot * self.heads
    }
}

/// One `cublasGemmStridedBatchedEx` call: for each i < batch, C_i = alpha op(A_i) op(B_i) +
/// beta C_i, column-major, X_i starting `stride_x` elements after X_{i-1}.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchedCall {
    /// op(A) = Aᵀ.
    pub trans_a: bool,
    /// op(B) = Bᵀ.
    pub trans_b: bool,
    /// Rows of op(A) and C.
    pub m: i32,
    /// Columns of op(B) and C.
    pub n: i32,
    /// Columns of op(A), rows of op(B).
    pub k: i32,
    /// The region A.
    pub a: Region,
    /// Leading dimension of A.
    pub lda: i32,
    /// Elements between consecutive A_i.
    pub stride_a: i64,
    /// The region B.
    pub b: Region,
    /// Leading dimension of B.
    pub ldb: i32,
    /// Elements between consecutive B_i.
    pub stride_b: i64,
    /// The region C.
    pub c: Region,
    /// Leading dimension of C.
    pub ldc: i32,
    /// Elements between consecutive C_i.
    pub stride_c: i64,
    /// Matrices (B*NH).
    pub batch: i32,
    /// alpha.
    pub alpha: f32,
    /// beta.
    pub beta: f32,
}

/// The per-pair shapes as C ints and strides; [`AttentionShape::new`] checked them.
struct Dims {
    t: i32,
    hs: i32,
    batch: i32,
    tt: i64,
    ths: i64,
}

fn dims(s: AttentionShape) -> Dims {
    // Checked to fit an i32 by AttentionShape::new.
    let as_int = |v: usize| i32::try_from(v).unwrap_or(i32::MAX);
    Dims {
        t: as_int(s.t),
        hs: as_int(s.hs),
        batch: as_int(s.b * s.nh),
        tt: i64::from(as_int(s.t * s.t)),
        ths: i64::from(as_int(s.t * s.hs)),
    }
}

/// out (T,T) = lhs (T,hs) · rhsᵀ: outᵀ = rhs · lhsᵀ.
fn by_transposed(s: AttentionShape, lhs: Region, rhs: Region, out: Region) -> BatchedCall {
    let d = dims(s);
    BatchedCall {
        trans_a: true,
        trans_b: false,
        m: d.t,
        n: d.t,
        k: d.hs,
        a: rhs,
        lda: d.hs,
        stride_a: d.ths,
        b: lhs,
        ldb: d.hs,
        stride_b: d.ths,
        c: out,
        ldc: d.t,
        stride_c: d.tt,
        batch: d.batch,
        alpha: 1.0,
        beta: 0.0,
    }
}

/// out (T,hs) = op(w) · x, with w (T,T) taken as is or transposed: outᵀ = xᵀ · op(w)ᵀ.
fn weigh(s: AttentionShape, w: Region, transpose_w: bool, x: Region, out: Region) -> BatchedCall {
    let d = dims(s);
    BatchedCall {
        trans_a: false,
        trans_b: transpose_w,
        m: d.hs,
        n: d.t,
        k: d.t,
        a: x,
        lda: d.hs,
        stride_a: d.ths,
        b: w,
        ldb: d.t,
        stride_b: d.tt,
        c: out,
        ldc: d.hs,
        stride_c: d.ths,
        batch: d.batch,
        alpha: 1.0,
        beta: 0.0,
    }
}

/// Forward: scores = q · kᵀ (unscaled).
#[must_use]
pub fn scores(s: AttentionShape) -> BatchedCall {
    by_transposed(s, Region::Q, Region::K, Region::Scores)
}

/// Forward: y = att · v, att the softmax weights in the scores region.
#[must_use]
pub fn weighted_values(s: AttentionShape) -> BatchedCall {
    weigh(s, Region::Scores, false, Region::V, Region::Y)
}

/// Backward: d(v) = attᵀ · dy, att permuted into the scores region.
#[must_use]
pub fn d_values(s: AttentionShape) -> BatchedCall {
    weigh(s, Region::Scores, true, Region::Y, Region::DV)
}

/// Backward: d(att) = dy · vᵀ.
#[must_use]
pub fn d_weights(s: AttentionShape) -> BatchedCall {
    by_transposed(s, Region::Y, Region::V, Region::Scores)
}

/// Backward: d(q) = d(dot) · k, d(dot) the scaled softmax gradient in the scores region.
#[must_use]
pub fn d_queries(s: AttentionShape) -> BatchedCall {
    weigh(s, Region::Scores, false, Region::K, Region::DQ)
}

/// Backward: d(k) = d(dot)ᵀ · q.
#[must_use]
pub fn d_keys(s: AttentionShape) -> BatchedCall {
    weigh(s, Region::Scores, true, Region::Q, Region::DK)
}

#[cfg(test)]
#[path = "attention_gemm_naive.rs"]
mod naive;
#[cfg(test)]
#[path = "attention_gemm_tests.rs"]
mod tests;
