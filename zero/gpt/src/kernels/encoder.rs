//! Token + position embedding.
//!
//! Legend: B batch, T sequence, C channels, Vp padded vocabulary.

use rayon::prelude::*;

/// `out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:]`.
///
/// `out` (B,T,C), `tokens` (B,T), `wte` (Vp,C), `wpe` (maxT,C) with maxT >= T.
///
/// # Panics
/// On slice lengths that do not match the dimensions, or a token >= Vp.
pub fn encoder_forward(
    out: &mut [f32],
    tokens: &[u32],
    wte: &[f32],
    wpe: &[f32],
    b: usize,
    t: usize,
    c: usize,
) {
    assert_eq!(out.len(), b * t * c);
    assert_eq!(tokens.len(), b * t);
    assert!(wpe.len() >= t * c);
    out.par_chunks_mut(c)
        .zip(tokens.par_iter())
        .enumerate()
        .for_each(|(row, (o, &tok))| {
            let pos = row % t;
            let tok = tok as usize;
            let e = &wte[tok * c..(tok + 1) * c]; // (C,)
            let p = &wpe[pos * c..(pos + 1) * c]; // (C,)
            for ((o, &e), &p) in o.iter_mut().zip(e).zip(p) {
                *o = e + p;
            }
        });
}

/// `dwte[tokens[b,t],:] += dout[b,t,:]; dwpe[t,:] += dout[b,t,:]`.
///
/// Sequential on purpose: rows that share a token add into the same `dwte` row, and a fixed
/// order keeps the result bitwise deterministic. It is O(B*T*C), negligible beside the matmuls.
///
/// # Panics
/// On slice lengths that do not match the dimensions, or a token >= Vp.
pub fn encoder_backward(
    dwte: &mut [f32],
    dwpe: &mut [f32],
    dout: &[f32],
    tokens: &[u32],
    b: usize,
    t: usize,
    c: usize,
) {
    assert_eq!(dout.len(), b * t * c);
    assert_eq!(tokens.len(), b * t);
    assert!(dwpe.len() >= t * c);
    for (row, (d, &tok)) in dout.chunks_exact(c).zip(tokens).enumerate() {
        let pos = row % t;
        let tok = tok as usize;
        for (w, &g) in dwte[tok * c..(tok + 1) * c].iter_mut().zip(d) {
            *w += g;
        }
        for (w, &g) in dwpe[pos * c..(pos + 1) * c].iter_mut().zip(d) {
            *w += g;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::fd;

    #[test]
    fn backward_matches_finite_differences() {
        let (b, t, c, vp) = (2, 3, 4, 5);
        let tokens = [1u32, 4, 1, 0, 2, 1];
        let wte = fd::random(vp * c, 1, 1.0);
        let wpe = fd::random(t * c, 2, 1.0);
        let w = fd::random(b * t * c, 3, 1.0);
        let mut dwte = vec![0.0; vp * c];
        let mut dwpe = vec![0.0; t * c];
        encoder_backward(&mut dwte, &mut dwpe, &w, &tokens, b, t, c);
        let loss = |wte: &[f32], wpe: &[f32]| {
            let mut out = vec![0.0; b * t * c];
            encoder_forward(&mut out, &tokens, wte, wpe, b, t, c);
            fd::dot(&w, &out)
        };
        fd::check("dwte", &wte, &dwte, 1e-2, 1e-3, |x| loss(x, &wpe));
        fd::check("dwpe", &wpe, &dwpe, 1e-2, 1e-3, |x| loss(&wte, x));
    }
}
