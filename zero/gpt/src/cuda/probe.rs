//! Run-time checks that the CUDA libraries exist, before cudarc touches them.
//!
//! cudarc loads each library on first use and panics when it is missing; its `sys` modules
//! offer `is_culib_present`, which tries the same file names and returns false instead.
//! Every entry point of the CUDA backend calls these first, so a machine without CUDA gets
//! [`GptError::CudaUnavailable`] naming the library.

use crate::{GptError, Result};

/// One library the backend loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Library {
    /// The driver API (`libcuda.so`), installed with the NVIDIA driver.
    Driver,
    /// cuBLAS (`libcublas.so`), from the CUDA toolkit or the `nvidia-cublas` wheel.
    Cublas,
    /// NVRTC (`libnvrtc.so`), from the toolkit or the `nvidia-cuda-nvrtc` wheel.
    Nvrtc,
}

impl Library {
    /// The file cudarc looks for, as the error names it.
    #[must_use]
    pub fn file_name(self) -> &'static str {
        match self {
            Self::Driver => "libcuda",
            Self::Cublas => "libcublas",
            Self::Nvrtc => "libnvrtc",
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
            }
        }
    }

    /// Ok when present, else the error that names the library and how to provide it.
    pub fn require(self) -> Result<()> {
        if self.is_present() {
            return Ok(());
        }
        let how = match self {
            Self::Driver => "no NVIDIA driver is installed (libcuda.so / libcuda.so.1 not found)",
            Self::Cublas => "cuBLAS not found: install the CUDA toolkit or the nvidia-cublas wheel and put its lib folder on LD_LIBRARY_PATH",
            Self::Nvrtc => "NVRTC not found: install the CUDA toolkit or the nvidia-cuda-nvrtc wheel and put its lib folder on LD_LIBRARY_PATH (scripts/nvrtc-check.sh does this)",
        };
        Err(GptError::CudaUnavailable {
            library: self.file_name(),
            reason: how.to_string(),
        })
    }
}

/// Checks every library [`super::CudaBackend`] needs, driver first.
pub fn require_backend_libraries() -> Result<()> {
    [Library::Driver, Library::Cublas, Library::Nvrtc]
        .into_iter()
        .try_for_each(Library::require)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_is_an_error_that_names_it() {
        for lib in [Library::Driver, Library::Cublas, Library::Nvrtc] {
            match lib.require() {
                Ok(()) => assert!(lib.is_present()),
                Err(GptError::CudaUnavailable { library, reason }) => {
                    assert!(!lib.is_present());
                    assert_eq!(library, lib.file_name());
                    assert!(!reason.is_empty());
                }
                Err(other) => panic!("unexpected {other}"),
            }
        }
    }
}
