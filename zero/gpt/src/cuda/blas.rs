//! The backend's cuBLAS calls: `cublasGemmEx` for the layers' products
//! ([`super::gemm`]) and `cublasGemmStridedBatchedEx` for attention's
//! ([`super::attention_gemm`]), fp32 in memory, in the backend's [`GemmMath`] mode.

use std::ffi::c_void;

use cudarc::cublas;
use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};

use super::attention_gemm::{BatchedCall, Place};
use super::backend::CudaBackend;
use super::gemm::{GemmCall, GemmMath, Operand};
use crate::{GptError, Result};

impl CudaBackend {
    /// Enqueues `call` (C = op(A) op(B) + beta C, fp32 in memory) in the backend's math mode.
    pub(super) fn gemm(&self, call: Result<GemmCall>, inp: u64, weight: u64, dout: u64, dst: u64) {
        let result = self.bind_context().and(call).and_then(|call| {
            let pick = |op: Operand| match op {
                Operand::Inp => inp,
                Operand::Weight => weight,
                Operand::Dout => dout,
            };
            let (alpha, beta) = (1.0f32, if call.beta_one { 1.0f32 } else { 0.0 });
            // SAFETY: the gemm module maps (N,C,OC) to a column-major call that reads exactly
            // the row-major inp (N,C), weight (OC,C), dout (N,OC) and writes dst, whose
            // lengths the caller asserted; all are f32 (CUDA_R_32F); alpha and beta are host
            // f32 (the handle's default pointer mode); the handle is bound to self.stream.
            unsafe {
                cublas::result::gemm_ex(
                    self.blas.raw(),
                    op(call.trans_a),
                    op(call.trans_b),
                    call.m,
                    call.n,
                    call.k,
                    (&raw const alpha).cast(),
                    pick(call.a) as usize as *const c_void,
                    F32,
                    call.lda,
                    pick(call.b) as usize as *const c_void,
                    F32,
                    call.ldb,
                    (&raw const beta).cast(),
                    dst as usize as *mut c_void,
                    F32,
                    call.ldc,
                    compute_type(self.math),
                    cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                )
            }
            .map_err(blas_err("cublasGemmEx"))
        });
        self.record(result);
    }

    /// Enqueues one of attention's batched products in the backend's math mode, `at` giving
    /// each operand's device address (the attention scratch's regions, the caller's att).
    pub(super) fn gemm_batched(&self, call: &BatchedCall, at: impl Fn(Place) -> u64) {
        if let Err(e) = self.bind_context() {
            self.record(Err(e));
            return;
        }
        // SAFETY: attention_gemm maps the checked shape to products whose matrices stay
        // inside their buffers (the regions of the caller's scratch of layout.len f32, or
        // att of B*T*NH*T f32, whose length the caller asserted) from the places `at`
        // resolves, and whose C entries do not overlap; all are f32; alpha and beta are host
        // f32; the handle is bound to self.stream.
        let result = unsafe {
            cublas::result::gemm_strided_batched_ex(
                self.blas.raw(),
                op(call.trans_a),
                op(call.trans_b),
                call.m,
                call.n,
                call.k,
                (&raw const call.alpha).cast(),
                at(call.a) as usize as *const c_void,
                F32,
                call.lda,
                call.stride_a,
                at(call.b) as usize as *const c_void,
                F32,
                call.ldb,
                call.stride_b,
                (&raw const call.beta).cast(),
                at(call.c) as usize as *mut c_void,
                F32,
                call.ldc,
                call.stride_c,
                call.batch,
                compute_type(self.math),
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(blas_err("cublasGemmStridedBatchedEx"));
        self.record(result);
    }
}

const F32: cudaDataType = cudaDataType::CUDA_R_32F;

fn op(transpose: bool) -> cublasOperation_t {
    if transpose {
        cublasOperation_t::CUBLAS_OP_T
    } else {
        cublasOperation_t::CUBLAS_OP_N
    }
}

fn compute_type(math: GemmMath) -> cublasComputeType_t {
    match math {
        GemmMath::Exact => cublasComputeType_t::CUBLAS_COMPUTE_32F,
        GemmMath::Tf32 => cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32,
        GemmMath::Bf16 => cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_16BF,
        GemmMath::F16 => cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_16F,
    }
}

impl CudaBackend {
    /// Makes the backend's context current on the calling thread, reporting an error cudarc
    /// recorded earlier as such (`zero_alloc::context::bind`). cuBLAS runs in whatever
    /// context is current, and unlike cudarc's kernel launches a raw cuBLAS call binds none:
    /// a product that is a rank thread's first CUDA call would otherwise run with no context.
    /// Every operation of the backend starts here.
    pub(super) fn bind_context(&self) -> Result<()> {
        zero_alloc::context::bind(self.stream().context())
            .map_err(|e| zero_alloc::AllocError::from(e).into())
    }
}

fn blas_err(op: &'static str) -> impl Fn(cublas::result::CublasError) -> GptError {
    move |e| GptError::Cuda {
        op,
        message: format!("{e:?}"),
    }
}
