//! Residual addition.
//!
//! Legend: N = B*T*C elements.

use rayon::prelude::*;

const CHUNK: usize = 1 << 14;

/// out = inp1 + inp2, all (N,).
///
/// # Panics
/// If the three lengths differ.
pub fn residual_forward(out: &mut [f32], inp1: &[f32], inp2: &[f32]) {
    assert_eq!(out.len(), inp1.len());
    assert_eq!(out.len(), inp2.len());
    out.par_chunks_mut(CHUNK)
        .zip(inp1.par_chunks(CHUNK).zip(inp2.par_chunks(CHUNK)))
        .for_each(|(o, (a, b))| {
            for ((o, &a), &b) in o.iter_mut().zip(a).zip(b) {
                *o = a + b;
            }
        });
}

/// dinp1 += dout; dinp2 += dout, all (N,).
///
/// The model does not call this: it keeps one residual-stream gradient and lets each branch
/// add into it (the same sums, one buffer fewer). It is here for backends and tests.
///
/// # Panics
/// If the three lengths differ.
pub fn residual_backward(dinp1: &mut [f32], dinp2: &mut [f32], dout: &[f32]) {
    assert_eq!(dinp1.len(), dout.len());
    assert_eq!(dinp2.len(), dout.len());
    for ((a, b), &d) in dinp1.iter_mut().zip(dinp2.iter_mut()).zip(dout) {
        *a += d;
        *b += d;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::fd;

    #[test]
    fn backward_matches_finite_differences() {
        let n = 10;
        let a = fd::random(n, 1, 1.0);
        let b = fd::random(n, 2, 1.0);
        let w = fd::random(n, 3, 1.0);
        let (mut da, mut db) = (vec![0.0; n], vec![0.0; n]);
        residual_backward(&mut da, &mut db, &w);
        let f = |x: &[f32], y: &[f32]| {
            let mut out = vec![0.0; n];
            residual_forward(&mut out, x, y);
            fd::dot(&w, &out)
        };
        fd::check("dinp1", &a, &da, 1e-2, 1e-3, |x| f(x, &b));
        fd::check("dinp2", &b, &db, 1e-2, 1e-3, |y| f(&a, y));
    }
}
