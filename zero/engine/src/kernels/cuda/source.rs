//! The CUDA C source of [`super::CudaKernels`], its kernel names, its NVRTC program (compiled
//! by zero-alloc's [`zero_alloc::nvrtc`], which runs on a host without a GPU) and its launch
//! geometry.

use zero_alloc::nvrtc::{KernelSet, Program, BITWISE_OPTIONS};
use zero_comm::DType;

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

/// [`ENGINE_SOURCE`] as the NVRTC program zero-alloc compiles: [`BITWISE_OPTIONS`] keep
/// `a * b + c` two roundings, as Rust computes it, so element-wise kernels give the host's
/// bits.
pub const ENGINE_PROGRAM: Program = Program {
    name: "engine.cu",
    prelude: "",
    text: ENGINE_SOURCE,
    functions: ENGINE_KERNELS,
    options: BITWISE_OPTIONS,
};

/// The engine's kernels, as zero-alloc compiles and caches them per device.
pub static ENGINE_KERNEL_SET: KernelSet = KernelSet {
    name: "zero-engine",
    programs: &[ENGINE_PROGRAM],
};

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
        // engine.cu has no kernels for these (no precision stores them): the lookup of the
        // name fails with `Error::Device` ("no kernel named ...").
        DType::I32 => "i32",
        DType::I64 => "i64",
        DType::F64 => "f64",
    };
    format!("{kernel}_{suffix}")
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
