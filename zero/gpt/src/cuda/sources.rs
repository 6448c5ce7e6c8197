//! The CUDA C kernel sources, compiled at run time by NVRTC (through zero-alloc's
//! [`zero_alloc::nvrtc`], which also caches them per device), and the options they need.
//!
//! Each `.cu` file under `kernels/` is one NVRTC program: [`COMMON`] (exp, tanh, the 16-lane
//! dot product and warp reductions shared by all) is prepended to it, since NVRTC sees no
//! file system. Every kernel is `extern "C"`, so its PTX entry has the name listed here.

pub use zero_alloc::nvrtc::{declared_kernels, CI_ARCHS};
use zero_alloc::nvrtc::{KernelSet, Program, BITWISE_OPTIONS};

/// Text prepended to every source (`kernels/common.cuh`).
pub const COMMON: &str = include_str!("kernels/common.cuh");

/// One `kernels/*.cu` file, compiled after [`COMMON`] with [`BITWISE_OPTIONS`] (which the
/// kernels whose contract against their CPU twin is bitwise need).
const fn source(
    name: &'static str,
    text: &'static str,
    functions: &'static [&'static str],
) -> Program {
    Program {
        name,
        prelude: COMMON,
        text,
        functions,
        options: BITWISE_OPTIONS,
    }
}

/// Every kernel of the backend, as zero-alloc compiles and caches them per device.
pub static KERNELS: KernelSet = KernelSet {
    name: "zero-gpt",
    programs: SOURCES,
};

/// Every kernel source of the backend; each `functions` list is in file order.
pub const SOURCES: &[Program] = &[
    source(
        "encoder.cu",
        include_str!("kernels/encoder.cu"),
        &[
            "encoder_forward",
            "encoder_backward_wpe",
            "encoder_backward_wte_check",
            "encoder_backward_wte_grouped",
            "encoder_backward_wte",
        ],
    ),
    source(
        "layernorm.cu",
        include_str!("kernels/layernorm.cu"),
        &[
            "layernorm_forward",
            "layernorm_backward_input",
            "layernorm_backward_params_partials",
            "layernorm_backward_params_finish",
        ],
    ),
    source(
        "matmul.cu",
        include_str!("kernels/matmul.cu"),
        &[
            "bias_broadcast",
            "bias_backward_partials",
            "bias_backward_finish",
        ],
    ),
    source(
        "attention.cu",
        include_str!("kernels/attention.cu"),
        &[
            "attention_split_heads",
            "attention_merge_heads",
            "attention_softmax_forward",
            "attention_softmax_backward",
        ],
    ),
    source(
        "gelu.cu",
        include_str!("kernels/gelu.cu"),
        &["gelu_forward", "gelu_backward"],
    ),
    source(
        "residual.cu",
        include_str!("kernels/residual.cu"),
        &["residual_forward", "residual_backward"],
    ),
    source(
        "cross_entropy.cu",
        include_str!("kernels/cross_entropy.cu"),
        &["crossentropy_forward", "crossentropy_backward"],
    ),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_function_is_declared_in_its_file_and_nothing_else() {
        for src in SOURCES {
            assert_eq!(
                declared_kernels(src.text),
                src.functions,
                "{}: the list and the file disagree",
                src.name
            );
        }
    }

    #[test]
    fn kernel_names_are_unique_across_sources() {
        let mut all: Vec<&str> = SOURCES.iter().flat_map(|s| s.functions.to_vec()).collect();
        let total = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), total);
    }
}
