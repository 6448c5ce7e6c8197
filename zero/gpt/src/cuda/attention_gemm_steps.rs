//! The steps of attention as [`BatchedCall`]s: where each operand is (a scratch region or
//! att), its leading dimension and stride, and the batch (see the parent module's doc).
//!
//! Legend: B batch, T sequence, C channels, NH heads, hs = C/NH.

use super::{AttentionShape, Region};

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
