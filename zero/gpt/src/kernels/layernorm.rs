//! LayerNorm over the channel dimension.
//!
//! Legend: N = B*T rows, C channels.

use rayon::prelude::*;

use super::ROWS_PER_TASK;

/// GPT-2's epsilon.
const EPS: f32 = 1e-5;

/// out = (inp - mean) * rstd * weight + bias, per row; saves `mean` and `rstd` for backward.
///
/// `out` (N,C), `mean` (N,), `rstd` (N,), `inp` (N,C), `weight` (C,), `bias` (C,).
///
/// # Panics
/// On slice lengths that do not match the dimensions.
pub fn layernorm_forward(
    out: &mut [f32],
    mean: &mut [f32],
    rstd: &mut [f32],
    inp: &[f32],
    weight: &[f32],
    bias: &[f32],
    n: usize,
    c: usize,
) {
    assert_eq!(out.len(), n * c);
    assert_eq!(inp.len(), n * c);
    assert_eq!((mean.len(), rstd.len()), (n, n));
    assert_eq!((weight.len(), bias.len()), (c, c));
    let chunk = ROWS_PER_TASK * c;
    out.par_chunks_mut(chunk)
        .zip(inp.par_chunks(chunk))
        .zip(
            mean.par_chunks_mut(ROWS_PER_TASK)
                .zip(rstd.par_chunks_mut(ROWS_PER_TASK)),
        )
        .for_each(|((out, inp), (mean, rstd))| {
            for (((o, x), m), r) in out
                .chunks_exact_mut(c)
                .zip(inp.chunks_exact(c))
                .zip(mean)
                .zip(rstd)
            {
                let mu = x.iter().sum::<f32>() / c as f32;
                let var = x.iter().map(|&v| (v - mu) * (v - mu)).sum::<f32>() / c as f32;
                let s = 1.0 / (var + EPS).sqrt();
                for (((o, &v), &w), &b) in o.iter_mut().zip(x).zip(weight).zip(bias) {
                    *o = (v - mu) * s * w + b;
                }
                *m = mu;
                *r = s;
            }
        });
}

/// dinp, dweight, dbias += the gradients of `layernorm_forward` given `dout`.
///
/// `dinp` (N,C), `dweight` (C,), `dbias` (C,), `dout` (N,C), `inp` (N,C), `weight` (C,),
/// `mean` (N,), `rstd` (N,).
///
/// # Panics
/// On slice lengths that do not match the dimensions.
pub fn layernorm_backward(
    dinp: &mut [f32],
    dweight: &mut [f32],
    dbias: &mut [f32],
    dout: &[f32],
    inp: &[f32],
    weight: &[f32],
    mean: &[f32],
    rstd: &[f32],
    n: usize,
    c: usize,
) {
    assert_eq!(dinp.len(), n * c);
    assert_eq!((dout.len(), inp.len()), (n * c, n * c));
    assert_eq!((mean.len(), rstd.len()), (n, n));
    assert_eq!((weight.len(), dweight.len(), dbias.len()), (c, c, c));
    let chunk = ROWS_PER_TASK * c;
    // dinp rows are independent: parallel. dweight/dbias sum over rows: one pass in row order
    // below, so the sum is deterministic.
    dinp.par_chunks_mut(chunk)
        .zip(dout.par_chunks(chunk).zip(inp.par_chunks(chunk)))
        .zip(
            mean.par_chunks(ROWS_PER_TASK)
                .zip(rstd.par_chunks(ROWS_PER_TASK)),
        )
        .for_each(|((dinp, (dout, inp)), (mean, rstd))| {
            for (((di, (d, x)), &mu), &s) in dinp
                .chunks_exact_mut(c)
                .zip(dout.chunks_exact(c).zip(inp.chunks_exact(c)))
                .zip(mean)
                .zip(rstd)
            {
                // dnorm = dout * w; dx = (dnorm - mean(dnorm) - norm * mean(dnorm * norm)) * rstd
                let mut dnorm_mean = 0.0f32;
                let mut dnorm_norm_mean = 0.0f32;
                for ((&g, &v), &w) in d.iter().zip(x).zip(weight) {
                    let norm = (v - mu) * s;
                    dnorm_mean += g * w;
                    dnorm_norm_mean += g * w * norm;
                }
                dnorm_mean /= c as f32;
                dnorm_norm_mean /= c as f32;
                for (((di, &g), &v), &w) in di.iter_mut().zip(d).zip(x).zip(weight) {
                    let norm = (v - mu) * s;
                    *di += (g * w - dnorm_mean - norm * dnorm_norm_mean) * s;
                }
            }
        });
    for ((d, x), (&mu, &s)) in dout
        .chunks_exact(c)
        .zip(inp.chunks_exact(c))
        .zip(mean.iter().zip(rstd))
    {
        for (((dw, db), &g), &v) in dweight.iter_mut().zip(dbias.iter_mut()).zip(d).zip(x) {
            *dw += (v - mu) * s * g;
            *db += g;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::fd;

    #[test]
    fn backward_matches_finite_differences() {
        let (n, c) = (3, 8);
        let x = fd::random(n * c, 1, 2.0);
        let w = fd::random(c, 2, 1.5);
        let b = fd::random(c, 3, 1.0);
        let dout = fd::random(n * c, 4, 1.0);
        let loss = |x: &[f32], w: &[f32], b: &[f32]| {
            let (mut out, mut m, mut r) = (vec![0.0; n * c], vec![0.0; n], vec![0.0; n]);
            layernorm_forward(&mut out, &mut m, &mut r, x, w, b, n, c);
            fd::dot(&dout, &out)
        };
        let (mut out, mut m, mut r) = (vec![0.0; n * c], vec![0.0; n], vec![0.0; n]);
        layernorm_forward(&mut out, &mut m, &mut r, &x, &w, &b, n, c);
        let (mut dx, mut dw, mut db) = (vec![0.0; n * c], vec![0.0; c], vec![0.0; c]);
        layernorm_backward(&mut dx, &mut dw, &mut db, &dout, &x, &w, &m, &r, n, c);
        fd::check("dinp", &x, &dx, 1e-3, 5e-3, |x| loss(x, &w, &b));
        fd::check("dweight", &w, &dw, 1e-3, 5e-3, |w| loss(&x, w, &b));
        fd::check("dbias", &b, &db, 1e-3, 5e-3, |b| loss(&x, &w, b));
    }

    #[test]
    fn forward_normalises_each_row() {
        let (n, c) = (2, 16);
        let x = fd::random(n * c, 9, 5.0);
        let (mut out, mut m, mut r) = (vec![0.0; n * c], vec![0.0; n], vec![0.0; n]);
        layernorm_forward(&mut out, &mut m, &mut r, &x, &[1.0; 16], &[0.0; 16], n, c);
        for row in out.chunks(c) {
            let mu: f32 = row.iter().sum::<f32>() / c as f32;
            let var: f32 = row.iter().map(|v| v * v).sum::<f32>() / c as f32;
            assert!(mu.abs() < 1e-5);
            assert!((var - 1.0).abs() < 1e-3);
        }
    }
}
