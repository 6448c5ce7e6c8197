//! The CUDA side of the GPT-2 kernels: CUDA C sources compiled at run time by NVRTC, their
//! launch geometry, the cuBLAS mapping of the matrix products and of attention and, with the `cuda` feature,
//! [`CudaBackend`].
//!
//! What needs no GPU is always compiled and unit-tested: the sources and their kernel lists
//! ([`sources`]), launch geometry ([`geometry`]), the gemm mapping and math modes ([`gemm`])
//! and attention's batched products and scratch layout ([`attention_gemm`]). With the
//! `cuda` feature, cudarc loads the driver, cuBLAS and NVRTC at run time; a missing library
//! is a [`crate::GptError::CudaUnavailable`] naming it, never a panic. docs/gpu.md lists
//! every kernel with its geometry and its numerical contract against the CPU kernel.

pub mod attention_gemm;
pub mod column_sums;
pub mod gemm;
pub mod geometry;
pub mod sources;
pub mod token_groups;

#[cfg(feature = "cuda")]
mod attention;
#[cfg(feature = "cuda")]
mod backend;
#[cfg(feature = "cuda")]
mod blas;
#[cfg(feature = "cuda")]
mod blas_handle;
#[cfg(feature = "cuda")]
pub mod device;
#[cfg(feature = "cuda")]
mod kernels_impl;
#[cfg(feature = "cuda")]
mod memory;
#[cfg(feature = "cuda")]
mod reductions;

#[cfg(feature = "cuda")]
pub use backend::CudaBackend;
#[cfg(feature = "cuda")]
pub use device::{DeviceIds, DeviceSlice};
pub use gemm::GemmMath;
#[cfg(feature = "cuda")]
pub use memory::DeviceBuffer;

/// Whether a CUDA backend can start here: Ok, or the error naming what is missing (the
/// `cuda` feature, the driver, cuBLAS or NVRTC). Never panics.
///
/// # Errors
/// [`crate::GptError::CudaUnavailable`].
pub fn available() -> crate::Result<()> {
    #[cfg(feature = "cuda")]
    {
        use zero_alloc::CudaLibrary::{Cublas, Driver, Nvrtc};
        zero_alloc::CudaLibrary::require_all(&[Driver, Cublas, Nvrtc]).map_err(Into::into)
    }
    #[cfg(not(feature = "cuda"))]
    {
        Err(crate::GptError::CudaUnavailable {
            library: "cuda feature",
            reason: "zero-gpt was built without the `cuda` cargo feature".to_string(),
        })
    }
}
