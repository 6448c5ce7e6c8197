//! GELU, tanh approximation (as GPT-2).
//!
//! Legend: N elements (B*T*4C in the model).

use rayon::prelude::*;

use super::math;

const CHUNK: usize = 1 << 12;
/// sqrt(2/pi).
const S: f32 = 0.797_884_6;
const K: f32 = 0.044_715;

/// out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), all (N,).
///
/// # Panics
/// If the lengths differ.
pub fn gelu_forward(out: &mut [f32], inp: &[f32]) {
    assert_eq!(out.len(), inp.len());
    out.par_chunks_mut(CHUNK)
        .zip(inp.par_chunks(CHUNK))
        .for_each(|(o, x)| {
            for (o, &x) in o.iter_mut().zip(x) {
                let u = S * (x + K * x * x * x);
                *o = 0.5 * x * (1.0 + math::tanh(u));
            }
        });
}

/// dinp += gelu'(inp) * dout, all (N,).
///
/// # Panics
/// If the lengths differ.
pub fn gelu_backward(dinp: &mut [f32], inp: &[f32], dout: &[f32]) {
    assert_eq!(dinp.len(), inp.len());
    assert_eq!(dinp.len(), dout.len());
    dinp.par_chunks_mut(CHUNK)
        .zip(inp.par_chunks(CHUNK).zip(dout.par_chunks(CHUNK)))
        .for_each(|(di, (x, d))| {
            for ((di, &x), &d) in di.iter_mut().zip(x).zip(d) {
                let u = S * (x + K * x * x * x);
                let th = math::tanh(u);
                let sech2 = 1.0 - th * th;
                let local = 0.5 * (1.0 + th) + 0.5 * x * sech2 * S * (1.0 + 3.0 * K * x * x);
                *di += local * d;
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::fd;

    #[test]
    fn backward_matches_finite_differences() {
        let n = 40;
        let x = fd::random(n, 1, 3.0);
        let w = fd::random(n, 2, 1.0);
        let mut dx = vec![0.0; n];
        gelu_backward(&mut dx, &x, &w);
        fd::check("dinp", &x, &dx, 1e-3, 2e-3, |x| {
            let mut out = vec![0.0; n];
            gelu_forward(&mut out, x);
            fd::dot(&w, &out)
        });
    }

    #[test]
    fn forward_matches_known_values() {
        let mut out = [0.0f32; 3];
        gelu_forward(&mut out, &[0.0, 1.0, -1.0]);
        assert_eq!(out[0], 0.0);
        assert!((out[1] - 0.841_192).abs() < 1e-5, "{}", out[1]);
        assert!((out[2] + 0.158_808).abs() < 1e-5, "{}", out[2]);
    }
}
