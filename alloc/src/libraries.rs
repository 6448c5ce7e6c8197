//! Run-time checks that the CUDA libraries exist, before cudarc touches them (feature `cuda`).
//!
//! cudarc loads each library on first use and panics when it is missing; its `sys` modules
//! offer `is_culib_present`, which tries the same file names and returns false instead.
//! Every CUDA entry point of the workspace (arenas, kernels, collectives) asks here first, so
//! a machine without CUDA gets [`AllocError::CudaUnavailable`] naming the library.

use crate::error::{AllocError, Result};

/// One library cudarc loads at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CudaLibrary {
    /// The driver API (`libcuda.so`), installed with the NVIDIA driver.
    Driver,
    /// cuBLAS (`libcublas.so`), from the CUDA toolkit or the `nvidia-cublas` wheel.
    Cublas,
    /// NVRTC (`libnvrtc.so`), from the toolkit or the `nvidia-cuda-nvrtc` wheel.
    Nvrtc,
    /// NCCL (`libnccl.so`), from the `nvidia-nccl` wheel or the system's package.
    Nccl,
}

impl CudaLibrary {
    /// Every library, the driver first (the order in which a user should install them).
    pub const ALL: [Self; 4] = [Self::Driver, Self::Cublas, Self::Nvrtc, Self::Nccl];

    /// The file cudarc looks for, as errors name it.
    #[must_use]
    pub fn file_name(self) -> &'static str {
        match self {
            Self::Driver => "libcuda",
            Self::Cublas => "libcublas",
            Self::Nvrtc => "libnvrtc",
            Self::Nccl => "libnccl",
        }
    }

    /// What a user does to provide the library.
    #[must_use]
    pub fn how_to_install(self) -> &'static str {
        match self {
            Self::Driver => "no NVIDIA driver is installed (libcuda.so / libcuda.so.1 not found)",
            Self::Cublas => {
                "cuBLAS not found: install the CUDA toolkit or the nvidia-cublas wheel and put \
                 its lib folder on LD_LIBRARY_PATH"
            }
            Self::Nvrtc => {
                "NVRTC not found: install the CUDA toolkit or the nvidia-cuda-nvrtc wheel and \
                 put its lib folder on LD_LIBRARY_PATH (scripts/nvrtc-check.sh does this)"
            }
            Self::Nccl => {
                "libnccl.so was not found on the library path (cudarc does not try \
                 libnccl.so.2: where only that exists, as in pip's nvidia-nccl-cu* wheels, put \
                 a libnccl.so symlink to it in a folder on LD_LIBRARY_PATH)"
            }
        }
    }

    /// True when cudarc can load the library.
    #[must_use]
    pub fn is_present(self) -> bool {
        // SAFETY: is_culib_present only tries to dlopen the candidate file names and drops
        // each handle; it calls no symbol of the library.
        unsafe {
            match self {
                Self::Driver => cudarc::driver::sys::is_culib_present(),
                Self::Cublas => cudarc::cublas::sys::is_culib_present(),
                Self::Nvrtc => cudarc::nvrtc::sys::is_culib_present(),
                Self::Nccl => cudarc::nccl::sys::is_culib_present(),
            }
        }
    }

    /// Ok when present, else the error that names the library and how to provide it.
    ///
    /// # Errors
    /// [`AllocError::CudaUnavailable`].
    pub fn require(self) -> Result<()> {
        if self.is_present() {
            return Ok(());
        }
        Err(AllocError::CudaUnavailable {
            library: self.file_name(),
            reason: self.how_to_install(),
        })
    }

    /// Checks `libraries` in order; the first missing one is the error.
    ///
    /// # Errors
    /// [`AllocError::CudaUnavailable`] naming the first missing library.
    pub fn require_all(libraries: &[Self]) -> Result<()> {
        libraries.iter().try_for_each(|lib| lib.require())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_is_an_error_that_names_it_and_a_present_one_is_ok() {
        for lib in CudaLibrary::ALL {
            match lib.require() {
                Ok(()) => assert!(lib.is_present()),
                Err(AllocError::CudaUnavailable { library, reason }) => {
                    assert!(!lib.is_present());
                    assert_eq!(library, lib.file_name());
                    assert!(reason.contains("not found"), "{reason}");
                }
                Err(other) => panic!("unexpected {other}"),
            }
        }
    }
}
