//! The CUDA C source of [`super::CudaKernels`], its kernel names, NVRTC options and launch
//! geometry, and its compilation by NVRTC (which runs on a host without a GPU).

use cudarc::nvrtc::{self, CompileError, CompileOptions, Ptx};
use zero_comm::DType;

use crate::error::{Error, Result};

/// The program NVRTC compiles (`kernels/cuda/engine.cu`).
pub const ENGINE_SOURCE: &str = include_str!("engine.cu");

/// Every `extern "C"` kernel [`ENGINE_SOURCE`] defines (some through a macro, once per
/// storage type), so every PTX entry a compile must produce.
pub const ENGINE_KERNELS: &[&str] = &[
    "widen_f32",
    "narrow_f32",
    "accumulate_f32",
    "add_squares_partial_f32",
    "adamw_scale_f32",
    "widen_bf16",
    "narrow_bf16",
    "accumulate_bf16",
    "add_squares_partial_bf16",
    "adamw_scale_bf16",
    "widen_f16",
    "narrow_f16",
    "accumulate_f16",
    "add_squares_partial_f16",
    "adamw_scale_f16",
    "adamw_update",
];

/// Architectures CI compiles the source for: A100 (sm_80) and H100/H200 (sm_90).
pub const CI_ARCHS: &[&str] = &["sm_80", "sm_90"];

/// NVRTC options. `--fmad=false` keeps `a * b + c` two roundings, as Rust computes it, so
/// element-wise kernels give the host's bits; division and square root stay IEEE and
/// denormals are kept (NVRTC's defaults, stated so a changed default cannot change results).
pub const NVRTC_OPTIONS: &[&str] = &[
    "--fmad=false",
    "--prec-div=true",
    "--prec-sqrt=true",
    "--ftz=false",
];

/// Threads per block of every kernel (`ZE_BLOCK` in the source).
pub const BLOCK: u32 = 256;
/// Most blocks of an element-wise kernel (grid-stride loops cover the rest).
pub const MAX_BLOCKS: u32 = 8192;
/// Most blocks of `add_squares_partial_*`: the partial sums the host adds.
pub const MAX_SUM_BLOCKS: u32 = 1024;

/// Blocks for `n` elements: `ceil(n / BLOCK)`, at most `cap`; 0 for no elements.
#[must_use]
pub fn grid(n: usize, cap: u32) -> u32 {
    let blocks = n.div_ceil(BLOCK as usize);
    u32::try_from(blocks).map_or(cap, |b| b.min(cap))
}

/// `kernel` followed by the suffix of `dtype` (`widen` -> `widen_bf16`).
#[must_use]
pub fn typed(kernel: &str, dtype: DType) -> String {
    let suffix = match dtype {
        DType::F32 => "f32",
        DType::Bf16 => "bf16",
        DType::F16 => "f16",
    };
    format!("{kernel}_{suffix}")
}

/// Ok when NVRTC can be loaded, else an error naming it (cudarc panics on first use of a
/// missing library, so every entry point asks first).
///
/// # Errors
/// [`Error::Device`] naming `libnvrtc`.
pub fn require_nvrtc() -> Result<()> {
    // SAFETY: is_culib_present only tries to dlopen NVRTC's file names and drops each
    // handle; it calls no symbol of the library.
    if unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Ok(());
    }
    Err(Error::Device {
        op: "load libnvrtc",
        message: "NVRTC not found (libnvrtc.so): install the CUDA toolkit or the \
                  nvidia-cuda-nvrtc-cu12 wheel and put its lib folder on LD_LIBRARY_PATH"
            .to_string(),
    })
}

/// Compiles [`ENGINE_SOURCE`] to PTX for `arch` (`None`: NVRTC's default target).
///
/// # Errors
/// [`Error::Device`] when NVRTC is missing, or with the compiler's log when the source does
/// not compile.
pub fn compile_engine_kernels(arch: Option<&'static str>) -> Result<Ptx> {
    require_nvrtc()?;
    let opts = CompileOptions {
        arch,
        options: NVRTC_OPTIONS.iter().map(|s| (*s).to_string()).collect(),
        name: Some("engine.cu".to_string()),
        ..CompileOptions::default()
    };
    nvrtc::compile_ptx_with_opts(ENGINE_SOURCE, opts).map_err(|e| Error::Device {
        op: "NVRTC compile of engine.cu",
        message: format!(
            "for {}: {}",
            arch.unwrap_or("the default target"),
            match e {
                CompileError::CompileError { log, .. } => log.to_string_lossy().into_owned(),
                other => format!("{other:?}"),
            }
        ),
    })
}

/// The `sm_XY` name NVRTC takes for compute capability (major, minor) among those known
/// here; `None` (NVRTC's default target, JIT-compiled by the driver) otherwise.
#[must_use]
pub fn arch_for(major: i32, minor: i32) -> Option<&'static str> {
    Some(match (major, minor) {
        (7, 5) => "sm_75",
        (8, 0) => "sm_80",
        (8, 6) => "sm_86",
        (8, 9) => "sm_89",
        (9, 0) => "sm_90",
        (10, 0) => "sm_100",
        (12, 0) => "sm_120",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grids_cover_every_element_up_to_the_cap() {
        assert_eq!(grid(0, MAX_BLOCKS), 0);
        assert_eq!(grid(1, MAX_BLOCKS), 1);
        assert_eq!(grid(256, MAX_BLOCKS), 1);
        assert_eq!(grid(257, MAX_BLOCKS), 2);
        assert_eq!(grid(usize::MAX, MAX_SUM_BLOCKS), MAX_SUM_BLOCKS);
    }

    #[test]
    fn the_block_size_matches_the_source_and_every_kernel_is_listed_once() {
        assert!(ENGINE_SOURCE.contains(&format!("#define ZE_BLOCK {BLOCK}\n")));
        let mut names = ENGINE_KERNELS.to_vec();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ENGINE_KERNELS.len());
        for kernel in [
            "widen",
            "narrow",
            "accumulate",
            "add_squares_partial",
            "adamw_scale",
        ] {
            for dtype in [DType::F32, DType::Bf16, DType::F16] {
                assert!(ENGINE_KERNELS.contains(&typed(kernel, dtype).as_str()));
            }
        }
    }
}
