//! Causal multi-head self-attention (the part between the qkv and the output projections).
//!
//! Legend: B batch, T sequence, C channels, NH heads, hs = C/NH head size.
//!
//! `qkv` (B,T,3C) holds q, k, v side by side per position, head h at columns h*hs..(h+1)*hs of
//! each third. The saved attention weights are laid out (B,T,NH,T), not llm.c's (B,NH,T,T):
//! then one position's output row and all its heads' weights are contiguous, so forward runs
//! one rayon task per position without unsafe sharing. Pre-softmax scores are not kept: the
//! backward needs only the softmax output.

use rayon::prelude::*;

use super::math;

/// `out[b,t,h] = Σ_{t2<=t} softmax_t2(q[b,t,h]·k[b,t2,h] / sqrt(hs)) v[b,t2,h]`.
///
/// `out` (B,T,C), `att` (B,T,NH,T) softmax weights (zero above the diagonal), `qkv` (B,T,3C).
///
/// # Panics
/// On slice lengths that do not match the dimensions, or `c % nh != 0`.
pub fn attention_forward(
    out: &mut [f32],
    att: &mut [f32],
    qkv: &[f32],
    b: usize,
    t: usize,
    c: usize,
    nh: usize,
) {
    assert_eq!(c % nh, 0);
    assert_eq!(out.len(), b * t * c);
    assert_eq!(att.len(), b * t * nh * t);
    assert_eq!(qkv.len(), b * t * 3 * c);
    let hs = c / nh;
    let scale = 1.0 / (hs as f32).sqrt();
    out.par_chunks_mut(c)
        .zip(att.par_chunks_mut(nh * t))
        .enumerate()
        .for_each(|(row, (out, att))| {
            let (bi, ti) = (row / t, row % t);
            let seq = &qkv[bi * t * 3 * c..(bi + 1) * t * 3 * c]; // (T,3C) of this batch row
            for h in 0..nh {
                let q = &seq[ti * 3 * c + h * hs..][..hs]; // (hs,)
                let a = &mut att[h * t..(h + 1) * t]; // (T,)
                let mut max = f32::NEG_INFINITY;
                for (t2, a) in a.iter_mut().enumerate().take(ti + 1) {
                    let k = &seq[t2 * 3 * c + c + h * hs..][..hs];
                    let s = math::dot(q, k) * scale;
                    max = max.max(s);
                    *a = s;
                }
                let mut sum = 0.0f32;
                for a in &mut a[..=ti] {
                    *a = math::exp(*a - max);
                    sum += *a;
                }
                let inv = 1.0 / sum;
                for a in &mut a[..=ti] {
                    *a *= inv;
                }
                a[ti + 1..].fill(0.0);
                let o = &mut out[h * hs..(h + 1) * hs]; // (hs,)
                o.fill(0.0);
                for (t2, &w) in a[..=ti].iter().enumerate() {
                    let v = &seq[t2 * 3 * c + 2 * c + h * hs..][..hs];
                    for (o, &v) in o.iter_mut().zip(v) {
                        *o += w * v;
                    }
                }
            }
        });
}

/// dqkv += the gradient of `attention_forward` given `dout`.
///
/// `dqkv` (B,T,3C), `dout` (B,T,C), `qkv` (B,T,3C), `att` (B,T,NH,T) from the forward.
///
/// Keys and values receive gradient from every later position, so positions of one sequence
/// cannot be split without shared writes; (batch row, head) pairs can: each touches only its
/// own head's columns. One rayon task per pair writes a private (T,3,hs) block
/// ([`head_backward`]), then the blocks are added into `dqkv` in a fixed order
/// ([`add_head_blocks`]): B*NH tasks keep every thread busy even at B = 1, and the sums stay
/// deterministic.
///
/// # Panics
/// On slice lengths that do not match the dimensions, or `c % nh != 0`.
pub fn attention_backward(
    dqkv: &mut [f32],
    dout: &[f32],
    qkv: &[f32],
    att: &[f32],
    b: usize,
    t: usize,
    c: usize,
    nh: usize,
) {
    assert_eq!(c % nh, 0);
    assert_eq!(dqkv.len(), b * t * 3 * c);
    assert_eq!(dout.len(), b * t * c);
    assert_eq!(att.len(), b * t * nh * t);
    assert_eq!(qkv.len(), b * t * 3 * c);
    let dims = Dims {
        t,
        c,
        nh,
        hs: c / nh,
    };
    let mut blocks = vec![0.0f32; b * nh * t * 3 * dims.hs]; // (B,NH,T,3,hs): d(q), d(k), d(v)
    blocks
        .par_chunks_mut(t * 3 * dims.hs)
        .enumerate()
        .for_each(|(pair, block)| {
            let (bi, h) = (pair / nh, pair % nh);
            let seq = &qkv[bi * t * 3 * c..][..t * 3 * c]; // (T,3C)
            let dout = &dout[bi * t * c..][..t * c]; // (T,C)
            let att = &att[bi * t * nh * t..][..t * nh * t]; // (T,NH,T)
            head_backward(block, seq, dout, att, h, dims);
        });
    add_head_blocks(dqkv, &blocks, dims);
}

/// The shape every phase of [`attention_backward`] reads.
#[derive(Clone, Copy)]
struct Dims {
    t: usize,
    c: usize,
    nh: usize,
    /// Head size C/NH.
    hs: usize,
}

/// Head `h` of one batch row: its d(q), d(k), d(v) into `block` (T,3,hs), position by
/// position, from `seq` (T,3C), `dout` (T,C) and `att` (T,NH,T) of that row.
fn head_backward(block: &mut [f32], seq: &[f32], dout: &[f32], att: &[f32], h: usize, dims: Dims) {
    let Dims { t, c, nh, hs } = dims;
    let scale = 1.0 / (hs as f32).sqrt();
    let mut dpre = vec![0.0f32; t]; // (T,) scratch: d(score) of one row
    for ti in 0..t {
        let a = &att[(ti * nh + h) * t..][..=ti]; // (ti+1,)
        let d = &dout[ti * c + h * hs..][..hs]; // (hs,)
        let dpre = &mut dpre[..=ti];
        value_backward(block, dpre, seq, a, d, h, dims);
        softmax_backward(dpre, a, scale);
        score_backward(block, dpre, seq, ti, h, dims);
    }
}

/// Where head `h`'s columns of q (`which` 0), k (1) or v (2) start in row `ti` of (T,3C).
fn col(ti: usize, which: usize, h: usize, dims: Dims) -> usize {
    ti * 3 * dims.c + which * dims.c + h * dims.hs
}

/// out = att · v: d(att)[t2] = d · v[t2] into `datt`, and d(v)[t2] += att[t2] * d into
/// `block`, for the positions t2 <= ti that `a` (the row's weights) covers.
fn value_backward(
    block: &mut [f32],
    datt: &mut [f32],
    seq: &[f32],
    a: &[f32],
    d: &[f32],
    h: usize,
    dims: Dims,
) {
    let hs = dims.hs;
    for (t2, &w) in a.iter().enumerate() {
        datt[t2] = math::dot(d, &seq[col(t2, 2, h, dims)..][..hs]);
        for (dv, &g) in block[t2 * 3 * hs + 2 * hs..][..hs].iter_mut().zip(d) {
            *dv += w * g;
        }
    }
}

/// Softmax backward in place, with the score's scale folded in: d(score) = att * (d(att) -
/// Σ att * d(att)) * scale.
fn softmax_backward(dpre: &mut [f32], a: &[f32], scale: f32) {
    let dot = math::dot(a, dpre);
    for (dp, &w) in dpre.iter_mut().zip(a) {
        *dp = w * (*dp - dot) * scale;
    }
}

/// score[t2] = q · k[t2] * scale: d(q) += g k[t2] and d(k)[t2] += g q into `block`, for
/// row `ti`'s d(score) `dpre` (t2 <= ti).
fn score_backward(block: &mut [f32], dpre: &[f32], seq: &[f32], ti: usize, h: usize, dims: Dims) {
    let hs = dims.hs;
    let q = &seq[col(ti, 0, h, dims)..][..hs]; // (hs,)
    for (t2, &g) in dpre.iter().enumerate() {
        let k = &seq[col(t2, 1, h, dims)..][..hs]; // (hs,)
                                                   // Row ti's d(q) and row t2's d(k) (t2 <= ti) live in one block: split it at row ti
                                                   // so both can be borrowed at once.
        let (before, from_ti) = block.split_at_mut(ti * 3 * hs);
        let (dq, after_dq) = from_ti.split_at_mut(hs);
        let dk = if t2 == ti {
            &mut after_dq[..hs]
        } else {
            &mut before[t2 * 3 * hs + hs..][..hs]
        };
        for (dq, &k) in dq.iter_mut().zip(k) {
            *dq += g * k;
        }
        for (dk, &q) in dk.iter_mut().zip(q) {
            *dk += g * q;
        }
    }
}

/// dqkv += every head's block, batch rows in parallel, heads and positions in order.
fn add_head_blocks(dqkv: &mut [f32], blocks: &[f32], dims: Dims) {
    let Dims { t, c, nh, hs } = dims;
    dqkv.par_chunks_mut(t * 3 * c)
        .zip(blocks.par_chunks(nh * t * 3 * hs))
        .for_each(|(dseq, blocks)| {
            for (h, block) in blocks.chunks_exact(t * 3 * hs).enumerate() {
                for (ti, row) in block.chunks_exact(3 * hs).enumerate() {
                    for (which, grad) in row.chunks_exact(hs).enumerate() {
                        let dst = &mut dseq[ti * 3 * c + which * c + h * hs..][..hs];
                        for (d, &g) in dst.iter_mut().zip(grad) {
                            *d += g;
                        }
                    }
                }
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::fd;

    #[test]
    fn backward_matches_finite_differences() {
        for (b, t, c, nh) in [(2, 4, 6, 2), (1, 6, 9, 3)] {
            backward_case(b, t, c, nh);
        }
    }

    fn backward_case(b: usize, t: usize, c: usize, nh: usize) {
        let qkv = fd::random(b * t * 3 * c, 1, 1.5);
        let dout = fd::random(b * t * c, 2, 1.0);
        let forward = |qkv: &[f32]| {
            let (mut out, mut att) = (vec![0.0; b * t * c], vec![0.0; b * t * nh * t]);
            attention_forward(&mut out, &mut att, qkv, b, t, c, nh);
            (out, att)
        };
        let (_, att) = forward(&qkv);
        let mut dqkv = vec![0.0; qkv.len()];
        attention_backward(&mut dqkv, &dout, &qkv, &att, b, t, c, nh);
        fd::check("dqkv", &qkv, &dqkv, 1e-3, 5e-3, |x| {
            fd::dot(&dout, &forward(x).0)
        });
    }

    #[test]
    fn attention_is_causal_and_normalised() {
        let (b, t, c, nh) = (1, 5, 4, 2);
        let qkv = fd::random(b * t * 3 * c, 3, 1.0);
        let (mut out, mut att) = (vec![0.0; b * t * c], vec![0.0; b * t * nh * t]);
        attention_forward(&mut out, &mut att, &qkv, b, t, c, nh);
        for (i, row) in att.chunks(t).enumerate() {
            let ti = (i / nh) % t;
            assert!(row[ti + 1..].iter().all(|&w| w == 0.0));
            assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        }
        // Position 0 attends only to itself, so its output is its own value vector.
        assert_eq!(&out[..c], &qkv[2 * c..3 * c]);
    }
}
