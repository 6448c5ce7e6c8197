//! The fully connected layer's three products as column-major cuBLAS `cublasGemmEx` calls
//! (fp32 A, B and C), and the math mode ([`GemmMath`]) every product of a backend uses.
//!
//! Legend: N rows, C input channels, OC output channels; weights (OC,C) row-major.
//!
//! cuBLAS is column-major: a row-major (R,K) matrix is the column-major (K,R) matrix, its
//! transpose. So each row-major product X = A·B is computed as Xᵀ = Bᵀ·Aᵀ with the operands
//! swapped and no copy. The mapping is pure and tested here against the CPU kernels through
//! a naive column-major gemm, so a wrong transpose or leading dimension fails on a machine
//! without a GPU.

use super::geometry::checked_product;
use crate::{GptError, Result};

/// How cuBLAS computes a product of fp32 matrices (its `cublasComputeType_t`). Inputs and
/// outputs stay fp32 in memory in every mode; the fast modes round the inputs inside cuBLAS
/// and run on tensor cores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GemmMath {
    /// `CUBLAS_COMPUTE_32F`: fp32 multiply and accumulate, no tensor cores (the handle keeps
    /// cuBLAS's default math mode, so no TF32 either). The CPU-equality tests use this.
    #[default]
    Exact,
    /// `CUBLAS_COMPUTE_32F_FAST_TF32`: inputs rounded to TF32 (10-bit mantissa), fp32
    /// accumulation, tensor cores.
    Tf32,
    /// `CUBLAS_COMPUTE_32F_FAST_16BF`: inputs rounded to bf16 (8-bit significand), fp32
    /// accumulation, tensor cores.
    Bf16,
    /// `CUBLAS_COMPUTE_32F_FAST_16F`: inputs rounded to fp16, fp32 accumulation, tensor cores.
    F16,
}

/// Which buffer a gemm operand is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operand {
    /// The layer input (N,C).
    Inp,
    /// The weight (OC,C).
    Weight,
    /// The output gradient (N,OC).
    Dout,
}

/// One `cublasGemmEx` call: C = alpha op(A) op(B) + beta C, column-major, alpha = 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemmCall {
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
    /// The buffer A.
    pub a: Operand,
    /// Leading dimension of A.
    pub lda: i32,
    /// The buffer B.
    pub b: Operand,
    /// Leading dimension of B.
    pub ldb: i32,
    /// 0 overwrites C, 1 accumulates into it.
    pub beta_one: bool,
    /// Leading dimension of C.
    pub ldc: i32,
}

fn dim(what: &'static str, value: usize) -> Result<i32> {
    i32::try_from(value).map_err(|_| GptError::LaunchTooLarge {
        kernel: "cublasGemmEx",
        what,
        value,
        limit: i32::MAX as usize,
    })
}

/// Checks that every matrix of the layer has fewer than 2^31 elements (cuBLAS's `int`
/// dimensions and leading dimensions index them).
fn check_sizes(n: usize, c: usize, oc: usize) -> Result<(i32, i32, i32)> {
    dim("N*C", checked_product("cublasGemmEx", "N*C", &[n, c])?)?;
    dim("N*OC", checked_product("cublasGemmEx", "N*OC", &[n, oc])?)?;
    dim("OC*C", checked_product("cublasGemmEx", "OC*C", &[oc, c])?)?;
    Ok((dim("N", n)?, dim("C", c)?, dim("OC", oc)?))
}

/// out (N,OC) (+)= inp (N,C) · weight (OC,C)ᵀ, i.e. outᵀ = weight · inpᵀ (column-major).
/// `accumulate` is true when the bias was broadcast into `out` first.
pub fn forward(n: usize, c: usize, oc: usize, accumulate: bool) -> Result<GemmCall> {
    let (n, c, oc) = check_sizes(n, c, oc)?;
    Ok(GemmCall {
        trans_a: true,
        trans_b: false,
        m: oc,
        n,
        k: c,
        a: Operand::Weight,
        lda: c,
        b: Operand::Inp,
        ldb: c,
        beta_one: accumulate,
        ldc: oc,
    })
}

/// dinp (N,C) += dout (N,OC) · weight (OC,C), i.e. dinpᵀ = weightᵀ · doutᵀ.
pub fn backward_input(n: usize, c: usize, oc: usize) -> Result<GemmCall> {
    let (n, c, oc) = check_sizes(n, c, oc)?;
    Ok(GemmCall {
        trans_a: false,
        trans_b: false,
        m: c,
        n,
        k: oc,
        a: Operand::Weight,
        lda: c,
        b: Operand::Dout,
        ldb: oc,
        beta_one: true,
        ldc: c,
    })
}

/// dweight (OC,C) += dout (N,OC)ᵀ · inp (N,C), i.e. dweightᵀ = inpᵀ · dout.
pub fn backward_weight(n: usize, c: usize, oc: usize) -> Result<GemmCall> {
    let (n, c, oc) = check_sizes(n, c, oc)?;
    Ok(GemmCall {
        trans_a: false,
        trans_b: true,
        m: c,
        n: oc,
        k: n,
        a: Operand::Inp,
        lda: c,
        b: Operand::Dout,
        ldb: oc,
        beta_one: true,
        ldc: c,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::{fd, matmul};

    /// The BLAS definition of gemm, column-major, element by element, in f64.
    fn naive_gemm(call: &GemmCall, a: &[f32], b: &[f32], c: &mut [f32]) {
        let (m, n, k) = (call.m as usize, call.n as usize, call.k as usize);
        let (lda, ldb, ldc) = (call.lda as usize, call.ldb as usize, call.ldc as usize);
        let at = |i: usize, p: usize| {
            if call.trans_a {
                a[i * lda + p]
            } else {
                a[p * lda + i]
            }
        };
        let bt = |p: usize, j: usize| {
            if call.trans_b {
                b[p * ldb + j]
            } else {
                b[j * ldb + p]
            }
        };
        for j in 0..n {
            for i in 0..m {
                let dot: f64 = (0..k)
                    .map(|p| f64::from(at(i, p)) * f64::from(bt(p, j)))
                    .sum();
                let old = if call.beta_one {
                    f64::from(c[j * ldc + i])
                } else {
                    0.0
                };
                c[j * ldc + i] = (old + dot) as f32;
            }
        }
    }

    fn pick<'a>(op: Operand, inp: &'a [f32], w: &'a [f32], dout: &'a [f32]) -> &'a [f32] {
        match op {
            Operand::Inp => inp,
            Operand::Weight => w,
            Operand::Dout => dout,
        }
    }

    fn assert_close(got: &[f32], want: &[f32]) {
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-4, "{g} vs {w}");
        }
    }

    #[test]
    fn the_three_calls_compute_the_cpu_matmul() {
        let (n, c, oc) = (7, 5, 3);
        let inp = fd::random(n * c, 1, 1.0);
        let w = fd::random(oc * c, 2, 1.0);
        let dout = fd::random(n * oc, 3, 1.0);

        let mut want = vec![0.0; n * oc];
        matmul::matmul_forward(&mut want, &inp, &w, None, n, c, oc);
        let call = forward(n, c, oc, false).unwrap();
        let mut got = vec![9.0; n * oc]; // beta = 0 must ignore this
        naive_gemm(
            &call,
            pick(call.a, &inp, &w, &dout),
            pick(call.b, &inp, &w, &dout),
            &mut got,
        );
        assert_close(&got, &want);

        let (mut want_dx, mut want_dw) = (vec![0.5; n * c], vec![0.25; oc * c]);
        matmul::matmul_backward(&mut want_dx, &mut want_dw, None, &dout, &inp, &w, n, c, oc);
        let (mut dx, mut dw) = (vec![0.5; n * c], vec![0.25; oc * c]);
        for (call, dst) in [
            (backward_input(n, c, oc).unwrap(), &mut dx),
            (backward_weight(n, c, oc).unwrap(), &mut dw),
        ] {
            naive_gemm(
                &call,
                pick(call.a, &inp, &w, &dout),
                pick(call.b, &inp, &w, &dout),
                dst,
            );
        }
        assert_close(&dx, &want_dx);
        assert_close(&dw, &want_dw);
    }

    #[test]
    fn matrices_past_i32_indexing_are_rejected() {
        assert!(forward(1 << 20, 1 << 12, 8, false).is_err());
        assert!(backward_weight(8, 1 << 31, 1).is_err());
        assert!(backward_input(usize::MAX, 2, 2).is_err());
    }
}
