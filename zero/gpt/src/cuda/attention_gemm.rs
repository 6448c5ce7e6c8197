//! Causal attention as cuBLAS strided-batched products over the (batch row, head) pairs, with
//! the backend's scratch layout: pure data, tested on the CPU.
//!
//! Legend: B batch, T sequence, C channels, NH heads, hs = C/NH.
//!
//! The CUDA backend permutes q, k, v out of qkv (B,T,3,NH,hs) into (B,NH,T,hs) each, so every
//! (b, h) pair's q, k, v are contiguous row-major (T,hs) matrices, one fixed stride apart. As
//! in [`super::gemm`], a row-major product X = A·B is computed column-major as Xᵀ = Bᵀ·Aᵀ.
//! The scale 1/sqrt(hs) is applied by the softmax kernels, not by alpha, as the CPU kernel
//! scales the dot product.
//!
//! The caller's att (B,T,NH,T) is read and written in place. Within one batch row b, head h's
//! (T,T) matrix starts at b*T*NH*T + h*T with rows NH*T apart: one call of batch NH (ld NH*T,
//! stride T) covers the row. Across batch rows the pairs are T*NH*T apart, not NH*T, so no
//! single stride covers all B*NH pairs: a step that touches att is B calls of batch NH. The
//! backward's d(att) and d(score) live in the scratch's (B,NH,T,T) region, one call of batch
//! B*NH each.

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
    /// d(att), then d(score), in the backward: (B,NH,T,T). The forward does not use it.
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
    /// Checks that T, hs, the batch count B*NH, each per-pair matrix (T*T, T*hs) and att's row
    /// stride NH*T fit an `int`, and that the whole scratch and att (B*NH*T*T, the size of the
    /// scores region) fit a usize (strides are 64-bit in cuBLAS).
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
        int("NH*T", checked_product(KERNEL, "NH*T", &[nh, t])?)?;
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

/// A buffer a batched product reads or writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Buffer {
    /// A region of the attention scratch.
    Scratch(Region),
    /// The caller's att (B,T,NH,T), B*T*NH*T elements, outside the scratch.
    Att,
}

/// Where an operand's first matrix starts: a buffer and an element offset into it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    /// The buffer.
    pub buffer: Buffer,
    /// Elements from the buffer's (or region's) start.
    pub from: usize,
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
    /// Where A_0 is.
    pub a: Place,
    /// Leading dimension of A.
    pub lda: i32,
    /// Elements between consecutive A_i.
    pub stride_a: i64,
    /// Where B_0 is.
    pub b: Place,
    /// Leading dimension of B.
    pub ldb: i32,
    /// Elements between consecutive B_i.
    pub stride_b: i64,
    /// Where C_0 is.
    pub c: Place,
    /// Leading dimension of C.
    pub ldc: i32,
    /// Elements between consecutive C_i.
    pub stride_c: i64,
    /// Matrices: B*NH over the scratch, NH for one batch row of att.
    pub batch: i32,
    /// alpha.
    pub alpha: f32,
    /// beta.
    pub beta: f32,
}

/// B*NH (or NH) row-major matrices of one buffer: the first one's place, the row stride
/// (the column-major leading dimension) and the stride between matrices.
#[derive(Clone, Copy)]
struct Pairs {
    place: Place,
    ld: i32,
    stride: i64,
}

/// The per-pair shapes as C ints; [`AttentionShape::new`] checked them.
struct Dims {
    t: i32,
    hs: i32,
    nh: i32,
    /// B*NH.
    pairs: i32,
    b: usize,
    /// Elements of one batch row of a (B,NH,T,hs) region, and of att.
    row_heads: usize,
    row_att: usize,
}

fn dims(s: AttentionShape) -> Dims {
    // Checked to fit an i32 by AttentionShape::new.
    let as_int = |v: usize| i32::try_from(v).unwrap_or(i32::MAX);
    Dims {
        t: as_int(s.t),
        hs: as_int(s.hs),
        nh: as_int(s.nh),
        pairs: as_int(s.b * s.nh),
        b: s.b,
        row_heads: s.nh * s.t * s.hs,
        row_att: s.t * s.nh * s.t,
    }
}

impl Dims {
    /// The (T,hs) matrices of `region` from batch row `row`, contiguous.
    fn heads(&self, region: Region, row: usize) -> Pairs {
        Pairs {
            place: Place {
                buffer: Buffer::Scratch(region),
                from: row * self.row_heads,
            },
            ld: self.hs,
            stride: i64::from(self.t) * i64::from(self.hs),
        }
    }
    /// The (T,T) matrices of the scores region, contiguous.
    fn scores(&self) -> Pairs {
        Pairs {
            place: Place {
                buffer: Buffer::Scratch(Region::Scores),
                from: 0,
            },
            ld: self.t,
            stride: i64::from(self.t) * i64::from(self.t),
        }
    }
    /// The NH (T,T) matrices of att's batch row `row`: rows NH*T apart, heads T apart.
    fn att(&self, row: usize) -> Pairs {
        Pairs {
            place: Place {
                buffer: Buffer::Att,
                from: row * self.row_att,
            },
            ld: self.nh * self.t,
            stride: i64::from(self.t),
        }
    }
}

/// out (T,T) = lhs (T,hs) · rhsᵀ: outᵀ = rhs · lhsᵀ.
fn by_transposed(d: &Dims, lhs: Pairs, rhs: Pairs, out: Pairs, batch: i32) -> BatchedCall {
    BatchedCall {
        trans_a: true,
        trans_b: false,
        m: d.t,
        n: d.t,
        k: d.hs,
        a: rhs.place,
        lda: rhs.ld,
        stride_a: rhs.stride,
        b: lhs.place,
        ldb: lhs.ld,
        stride_b: lhs.stride,
        c: out.place,
        ldc: out.ld,
        stride_c: out.stride,
        batch,
        alpha: 1.0,
        beta: 0.0,
    }
}

/// out (T,hs) = op(w) · x, with w (T,T) taken as is or transposed: outᵀ = xᵀ · op(w)ᵀ.
fn weigh(d: &Dims, w: Pairs, transpose_w: bool, x: Pairs, out: Pairs, batch: i32) -> BatchedCall {
    BatchedCall {
        trans_a: false,
        trans_b: transpose_w,
        m: d.hs,
        n: d.t,
        k: d.t,
        a: x.place,
        lda: x.ld,
        stride_a: x.stride,
        b: w.place,
        ldb: w.ld,
        stride_b: w.stride,
        c: out.place,
        ldc: out.ld,
        stride_c: out.stride,
        batch,
        alpha: 1.0,
        beta: 0.0,
    }
}

/// One call per batch row b, of batch NH, made by `call` from the row's index.
fn per_batch_row(d: &Dims, call: impl Fn(usize) -> BatchedCall) -> Vec<BatchedCall> {
    (0..d.b).map(call).collect()
}

/// Forward: att = q · kᵀ (unscaled), written into att in place (B calls).
#[must_use]
pub fn scores(s: AttentionShape) -> Vec<BatchedCall> {
    let d = dims(s);
    per_batch_row(&d, |r| {
        let (q, k) = (d.heads(Region::Q, r), d.heads(Region::K, r));
        by_transposed(&d, q, k, d.att(r), d.nh)
    })
}

/// Forward: y = att · v, att the softmax weights (B calls).
#[must_use]
pub fn weighted_values(s: AttentionShape) -> Vec<BatchedCall> {
    let d = dims(s);
    per_batch_row(&d, |r| {
        let (v, y) = (d.heads(Region::V, r), d.heads(Region::Y, r));
        weigh(&d, d.att(r), false, v, y, d.nh)
    })
}

/// Backward: d(v) = attᵀ · dy, dy in the Y region (B calls).
#[must_use]
pub fn d_values(s: AttentionShape) -> Vec<BatchedCall> {
    let d = dims(s);
    per_batch_row(&d, |r| {
        let (dy, dv) = (d.heads(Region::Y, r), d.heads(Region::DV, r));
        weigh(&d, d.att(r), true, dy, dv, d.nh)
    })
}

/// Backward: d(att) = dy · vᵀ into the scores region (one call).
#[must_use]
pub fn d_weights(s: AttentionShape) -> Vec<BatchedCall> {
    let d = dims(s);
    let (dy, v) = (d.heads(Region::Y, 0), d.heads(Region::V, 0));
    vec![by_transposed(&d, dy, v, d.scores(), d.pairs)]
}

/// Backward: d(q) = d(dot) · k, d(dot) the scaled softmax gradient in the scores region.
#[must_use]
pub fn d_queries(s: AttentionShape) -> Vec<BatchedCall> {
    let d = dims(s);
    let (k, dq) = (d.heads(Region::K, 0), d.heads(Region::DQ, 0));
    vec![weigh(&d, d.scores(), false, k, dq, d.pairs)]
}

/// Backward: d(k) = d(dot)ᵀ · q.
#[must_use]
pub fn d_keys(s: AttentionShape) -> Vec<BatchedCall> {
    let d = dims(s);
    let (q, dk) = (d.heads(Region::Q, 0), d.heads(Region::DK, 0));
    vec![weigh(&d, d.scores(), true, q, dk, d.pairs)]
}

#[cfg(test)]
#[path = "attention_gemm_naive.rs"]
mod naive;
#[cfg(test)]
#[path = "attention_gemm_tests.rs"]
mod tests;
