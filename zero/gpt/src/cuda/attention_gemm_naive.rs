//! Test-only references for `attention_gemm`'s tests: the BLAS definition of a strided-batched
//! gemm, the head permutes and the masked softmax, written from their definitions and sharing
//! no code with the CUDA backend.

use super::{AttentionScratch, AttentionShape, BatchedCall, Buffer, Place, Region};

/// f32 rounded to the nearest bf16 (ties to even), for finite x: what a product in
/// `GemmMath::Bf16` does to its inputs.
pub(super) fn to_bf16(x: f32) -> f32 {
    let bits = x.to_bits();
    f32::from_bits((bits + 0x7fff + ((bits >> 16) & 1)) & 0xffff_0000)
}

/// The two buffers a batched product works on: the scratch (laid out by `layout`) and att.
pub(super) struct Buffers<'a> {
    pub layout: &'a AttentionScratch,
    pub scratch: &'a mut [f32],
    pub att: &'a mut [f32],
}

impl Buffers<'_> {
    /// Where `buffer` starts in its slice, and its length (the scores region is the last
    /// and runs to the end of the scratch; att has its own length).
    fn span(&self, buffer: Buffer) -> (usize, usize) {
        match buffer {
            Buffer::Att => (0, self.att.len()),
            Buffer::Scratch(r @ Region::Scores) => {
                let at = self.layout.offset(r);
                (at, self.layout.len - at)
            }
            Buffer::Scratch(r) => (self.layout.offset(r), self.layout.heads),
        }
    }
    /// The elements from `place` on, within its buffer.
    fn tail(&mut self, place: Place) -> &mut [f32] {
        let (at, len) = self.span(place.buffer);
        let whole = match place.buffer {
            Buffer::Att => &mut *self.att,
            Buffer::Scratch(_) => &mut *self.scratch,
        };
        &mut whole[at + place.from..at + len]
    }
}

/// The element offsets (from the matrix's start) of a stored (rows, cols) column-major matrix.
fn elements(rows: usize, cols: usize, ld: usize) -> impl Iterator<Item = usize> {
    (0..cols).flat_map(move |c| (0..rows).map(move |r| c * ld + r))
}

/// Panics unless `call` passes cuBLAS's argument checks (ld >= max(1, rows of the stored
/// matrix)), every batch entry's matrices lie inside their own buffer (a scratch region, or
/// att with its own length) from the operand's place on, and no element of C belongs to two
/// batch entries (cuBLAS leaves overlapping outputs undefined). Real cuBLAS checks only the
/// first; a mapping must guarantee all three.
fn assert_blas_rules(call: &BatchedCall, buffers: &Buffers<'_>) {
    let (m, n, k) = (call.m as usize, call.n as usize, call.k as usize);
    // Stored (rows, cols) of A, B, C, column-major.
    let a = if call.trans_a { (k, m) } else { (m, k) };
    let b = if call.trans_b { (n, k) } else { (k, n) };
    let operands = [
        ("A", call.a, a, call.lda, call.stride_a),
        ("B", call.b, b, call.ldb, call.stride_b),
        ("C", call.c, (m, n), call.ldc, call.stride_c),
    ];
    for (name, place, (rows, cols), ld, stride) in operands {
        let ld = ld as usize;
        assert!(
            ld >= rows.max(1),
            "{name}: ld {ld} < rows {rows} ({call:?})"
        );
        let footprint = (cols.max(1) - 1) * ld + rows;
        let last = place.from + (call.batch as usize - 1) * stride as usize + footprint;
        let (_, len) = buffers.span(place.buffer);
        assert!(
            last <= len,
            "{name}: batch reaches {last} of {:?} ({len})",
            place.buffer
        );
    }
    let mut written = vec![false; buffers.span(call.c.buffer).1];
    for i in 0..call.batch as usize {
        let start = call.c.from + i * call.stride_c as usize;
        for e in elements(m, n, call.ldc as usize) {
            let w = &mut written[start + e];
            assert!(!*w, "C: element {} in two batch entries", start + e);
            *w = true;
        }
    }
}

/// cublasGemmStridedBatchedEx by its definition, element by element in f64, on the scratch
/// and att, each input passed through `round` first. beta = 0 does not read C (it may hold
/// NaN), as in BLAS. Panics on a call cuBLAS would refuse, one that leaves its buffers or
/// writes an element twice (`assert_blas_rules`).
pub(super) fn naive_batched(call: &BatchedCall, buffers: &mut Buffers<'_>, round: fn(f32) -> f32) {
    assert_blas_rules(call, buffers);
    let (m, n, k) = (call.m as usize, call.n as usize, call.k as usize);
    let (lda, ldb, ldc) = (call.lda as usize, call.ldb as usize, call.ldc as usize);
    let a: Vec<f32> = buffers.tail(call.a).iter().map(|&x| round(x)).collect();
    let b: Vec<f32> = buffers.tail(call.b).iter().map(|&x| round(x)).collect();
    let c_all = buffers.tail(call.c);
    for i in 0..call.batch as usize {
        let (a, b) = (
            &a[i * call.stride_a as usize..],
            &b[i * call.stride_b as usize..],
        );
        let c = &mut c_all[i * call.stride_c as usize..];
        let at = |r: usize, p: usize| {
            if call.trans_a {
                a[r * lda + p]
            } else {
                a[p * lda + r]
            }
        };
        let bt = |p: usize, col: usize| {
            if call.trans_b {
                b[p * ldb + col]
            } else {
                b[col * ldb + p]
            }
        };
        for col in 0..n {
            for r in 0..m {
                let dot: f64 = (0..k)
                    .map(|p| f64::from(at(r, p)) * f64::from(bt(p, col)))
                    .sum();
                let old = if call.beta == 0.0 {
                    0.0
                } else {
                    f64::from(c[col * ldc + r])
                };
                c[col * ldc + r] =
                    (f64::from(call.alpha) * dot + f64::from(call.beta) * old) as f32;
            }
        }
    }
}

/// dst (W,B,NH,T,hs) from src (B,T,W,NH,hs).
pub(super) fn split_heads(
    dst: &mut [f32],
    src: &[f32],
    (b, t, w, nh, hs): (usize, usize, usize, usize, usize),
) {
    for bi in 0..b {
        for ti in 0..t {
            for wi in 0..w {
                for h in 0..nh {
                    for j in 0..hs {
                        let s = (((bi * t + ti) * w + wi) * nh + h) * hs + j;
                        dst[(((wi * b + bi) * nh + h) * t + ti) * hs + j] = src[s];
                    }
                }
            }
        }
    }
}

/// dst (B,T,W,NH,hs) += src (W,B,NH,T,hs), or = when not `add`.
pub(super) fn merge_heads(
    dst: &mut [f32],
    src: &[f32],
    (b, t, w, nh, hs): (usize, usize, usize, usize, usize),
    add: bool,
) {
    for bi in 0..b {
        for ti in 0..t {
            for wi in 0..w {
                for h in 0..nh {
                    for j in 0..hs {
                        let d = &mut dst[(((bi * t + ti) * w + wi) * nh + h) * hs + j];
                        let s = src[(((wi * b + bi) * nh + h) * t + ti) * hs + j];
                        *d = if add { *d + s } else { s };
                    }
                }
            }
        }
    }
}

/// att (B,T,NH,T) holds q·k; each row (b, t, h) becomes its softmax over t2 <= t of
/// q·k / sqrt(hs), zero above the diagonal, in place.
pub(super) fn softmax_forward(att: &mut [f32], s: AttentionShape) {
    let (t, nh) = (s.t, s.nh);
    let scale = 1.0 / (s.hs as f32).sqrt();
    for (row, r) in att.chunks_exact_mut(t).enumerate() {
        let ti = (row / nh) % t;
        let e: Vec<f32> = r[..=ti].iter().map(|&x| x * scale).collect();
        let max = e.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f32> = e.iter().map(|&x| (x - max).exp()).collect();
        let sum: f32 = e.iter().sum();
        for (t2, r) in r.iter_mut().enumerate() {
            *r = if t2 <= ti { e[t2] / sum } else { 0.0 };
        }
    }
}

/// d(att) in the scores region -> d(dot) = att (d(att) - Σ att d(att)) scale, masked.
pub(super) fn softmax_backward(scores: &mut [f32], att: &[f32], s: AttentionShape) {
    let (t, nh) = (s.t, s.nh);
    let scale = 1.0 / (s.hs as f32).sqrt();
    for (row, d) in scores.chunks_exact_mut(t).take(s.b * nh * t).enumerate() {
        let (ti, bh) = (row % t, row / t);
        let a = &att[((bh / nh * t + ti) * nh + bh % nh) * t..][..t];
        let dot: f32 = (0..=ti).map(|t2| a[t2] * d[t2]).sum();
        for t2 in 0..t {
            d[t2] = if t2 <= ti {
                a[t2] * (d[t2] - dot) * scale
            } else {
                0.0
            };
        }
    }
}
