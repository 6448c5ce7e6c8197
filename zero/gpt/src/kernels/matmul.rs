//! Fully connected layer on the `gemm` crate.
//!
//! Legend: N = B*T rows, C input channels, OC output channels. Weights are (OC, C) as in
//! llm.c and PyTorch's `nn.Linear`, so out = inp · weightᵀ + bias; `gemm` takes strides, so the
//! transposes cost nothing.
//!
//! `gemm::gemm` computes dst := alpha·dst + beta·lhs·rhs (alpha read only when `read_dst`).

use gemm::{gemm, Parallelism};

/// gemm's own rayon split over the current pool. Chosen over `Parallelism::None` inside our
/// own rayon split of the rows because gemm packs each operand block once for all threads
/// and stays single-threaded below its own size threshold (small products pay no fork).
/// Not measured against the alternative: the shared dev machine was too loaded for a wall-
/// clock comparison to mean anything; per CPU-second both threads run at the single-thread
/// rate (see docs/trainer.md).
fn parallelism() -> Parallelism {
    match rayon::current_num_threads() {
        0 | 1 => Parallelism::None,
        n => Parallelism::Rayon(n),
    }
}

fn stride(x: usize) -> isize {
    // Buffer lengths fit in isize (Rust allocations cannot exceed isize::MAX bytes), so every
    // stride derived from them does too.
    isize::try_from(x).unwrap_or(isize::MAX)
}

/// out = inp · weightᵀ + bias.
///
/// `out` (N,OC), `inp` (N,C), `weight` (OC,C), `bias` (OC,) or `None`.
///
/// # Panics
/// On slice lengths that do not match the dimensions.
pub fn matmul_forward(
    out: &mut [f32],
    inp: &[f32],
    weight: &[f32],
    bias: Option<&[f32]>,
    n: usize,
    c: usize,
    oc: usize,
) {
    assert_eq!(out.len(), n * oc);
    assert_eq!(inp.len(), n * c);
    assert_eq!(weight.len(), oc * c);
    if let Some(bias) = bias {
        assert_eq!(bias.len(), oc);
        for row in out.chunks_exact_mut(oc) {
            row.copy_from_slice(bias);
        }
    }
    // SAFETY: the asserts above give out n*oc, inp n*c and weight oc*c elements. gemm reads
    // lhs(i,k) at inp[i*c + k] (col stride 1, row stride c), rhs(k,j) = weight[j*c + k]
    // (col stride c, row stride 1), writes dst(i,j) at out[i*oc + j]: all in bounds, and out
    // is a unique borrow that aliases neither input.
    unsafe {
        gemm(
            n,
            oc,
            c,
            out.as_mut_ptr(),
            1,
            stride(oc),
            bias.is_some(),
            inp.as_ptr(),
            1,
            stride(c),
            weight.as_ptr(),
            stride(c),
            1,
            1.0,
            1.0,
            false,
            false,
            false,
            parallelism(),
        );
    }
}

/// dinp += dout · weight; dweight += doutᵀ · inp; dbias += column sums of dout.
///
/// `dinp` (N,C), `dweight` (OC,C), `dbias` (OC,) or `None`, `dout` (N,OC), `inp` (N,C),
/// `weight` (OC,C). The two products are independent: [`matmul_backward_input`] then
/// [`matmul_backward_weight`], so a caller may run them apart with the same bits (the tied
/// LM head does, to never hold the weight and its gradient at once).
///
/// # Panics
/// On slice lengths that do not match the dimensions.
pub fn matmul_backward(
    dinp: &mut [f32],
    dweight: &mut [f32],
    dbias: Option<&mut [f32]>,
    dout: &[f32],
    inp: &[f32],
    weight: &[f32],
    n: usize,
    c: usize,
    oc: usize,
) {
    matmul_backward_input(dinp, dout, weight, n, c, oc);
    matmul_backward_weight(dweight, dbias, dout, inp, n, c, oc);
}

/// dinp += dout · weight: `dinp` (N,C), `dout` (N,OC), `weight` (OC,C).
///
/// # Panics
/// On slice lengths that do not match the dimensions.
pub fn matmul_backward_input(
    dinp: &mut [f32],
    dout: &[f32],
    weight: &[f32],
    n: usize,
    c: usize,
    oc: usize,
) {
    assert_eq!(dinp.len(), n * c);
    assert_eq!(dout.len(), n * oc);
    assert_eq!(weight.len(), oc * c);
    // SAFETY: by the asserts, dst(i,j) = dinp[i*c + j] for i < n, j < c; lhs(i,k) =
    // dout[i*oc + k] for k < oc; rhs(k,j) = weight[k*c + j]: all in bounds; dinp is a unique
    // borrow distinct from dout and weight.
    unsafe {
        gemm(
            n,
            c,
            oc,
            dinp.as_mut_ptr(),
            1,
            stride(c),
            true,
            dout.as_ptr(),
            1,
            stride(oc),
            weight.as_ptr(),
            1,
            stride(c),
            1.0,
            1.0,
            false,
            false,
            false,
            parallelism(),
        );
    }
}

/// dweight += doutᵀ · inp; dbias += column sums of dout: `dweight` (OC,C), `dbias` (OC,) or
/// `None`, `dout` (N,OC), `inp` (N,C).
///
/// # Panics
/// On slice lengths that do not match the dimensions.
pub fn matmul_backward_weight(
    dweight: &mut [f32],
    dbias: Option<&mut [f32]>,
    dout: &[f32],
    inp: &[f32],
    n: usize,
    c: usize,
    oc: usize,
) {
    assert_eq!(dweight.len(), oc * c);
    assert_eq!(dout.len(), n * oc);
    assert_eq!(inp.len(), n * c);
    // SAFETY: by the asserts, dst(i,j) = dweight[i*c + j] for i < oc, j < c; lhs(i,k) =
    // dout[k*oc + i] for k < n (doutᵀ: col stride oc, row stride 1); rhs(k,j) = inp[k*c + j]:
    // all in bounds; dweight is a unique borrow distinct from dout and inp.
    unsafe {
        gemm(
            oc,
            c,
            n,
            dweight.as_mut_ptr(),
            1,
            stride(c),
            true,
            dout.as_ptr(),
            stride(oc),
            1,
            inp.as_ptr(),
            1,
            stride(c),
            1.0,
            1.0,
            false,
            false,
            false,
            parallelism(),
        );
    }
    if let Some(dbias) = dbias {
        assert_eq!(dbias.len(), oc);
        // Row by row in order: vectorises across OC and sums deterministically.
        for row in dout.chunks_exact(oc) {
            for (db, &g) in dbias.iter_mut().zip(row) {
                *db += g;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::fd;

    fn naive(inp: &[f32], w: &[f32], b: &[f32], n: usize, c: usize, oc: usize) -> Vec<f32> {
        let mut out = vec![0.0; n * oc];
        for i in 0..n {
            for o in 0..oc {
                let dot: f64 = (0..c)
                    .map(|k| f64::from(inp[i * c + k]) * f64::from(w[o * c + k]))
                    .sum();
                out[i * oc + o] = (dot + f64::from(b[o])) as f32;
            }
        }
        out
    }

    #[test]
    fn forward_matches_naive_product() {
        let (n, c, oc) = (37, 45, 29);
        let x = fd::random(n * c, 1, 1.0);
        let w = fd::random(oc * c, 2, 1.0);
        let b = fd::random(oc, 3, 1.0);
        let mut out = vec![0.0; n * oc];
        matmul_forward(&mut out, &x, &w, Some(&b), n, c, oc);
        for (a, e) in out.iter().zip(naive(&x, &w, &b, n, c, oc)) {
            assert!((a - e).abs() < 1e-4, "{a} vs {e}");
        }
    }

    #[test]
    fn backward_matches_finite_differences() {
        let (n, c, oc) = (5, 6, 7);
        let x = fd::random(n * c, 1, 1.0);
        let w = fd::random(oc * c, 2, 1.0);
        let b = fd::random(oc, 3, 1.0);
        let dout = fd::random(n * oc, 4, 1.0);
        let loss = |x: &[f32], w: &[f32], b: &[f32]| {
            let mut out = vec![0.0; n * oc];
            matmul_forward(&mut out, x, w, Some(b), n, c, oc);
            fd::dot(&dout, &out)
        };
        // Start from non-zero gradients to check that backward accumulates.
        let (mut dx, mut dw, mut db) = (vec![1.0; n * c], vec![1.0; oc * c], vec![1.0; oc]);
        matmul_backward(&mut dx, &mut dw, Some(&mut db), &dout, &x, &w, n, c, oc);
        let minus_one = |v: &[f32]| v.iter().map(|g| g - 1.0).collect::<Vec<_>>();
        fd::check("dinp", &x, &minus_one(&dx), 1e-2, 1e-3, |x| loss(x, &w, &b));
        fd::check("dweight", &w, &minus_one(&dw), 1e-2, 1e-3, |w| {
            loss(&x, w, &b)
        });
        fd::check("dbias", &b, &minus_one(&db), 1e-2, 1e-3, |b| {
            loss(&x, &w, b)
        });
    }

    #[test]
    fn large_threaded_product_matches_naive() {
        // Big enough that gemm splits it across threads.
        let (n, c, oc) = (64, 96, 160);
        let x = fd::random(n * c, 5, 1.0);
        let w = fd::random(oc * c, 6, 1.0);
        let mut out = vec![0.0; n * oc];
        matmul_forward(&mut out, &x, &w, None, n, c, oc);
        for (a, e) in out.iter().zip(naive(&x, &w, &vec![0.0; oc], n, c, oc)) {
            assert!((a - e).abs() < 1e-3, "{a} vs {e}");
        }
    }
}
