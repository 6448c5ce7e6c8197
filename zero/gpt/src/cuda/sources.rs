//! The CUDA C kernel sources, compiled at run time by NVRTC, and the options they need.
//!
//! Each `.cu` file under `kernels/` is one NVRTC program: [`COMMON`] (exp, tanh, the 16-lane
//! dot product and warp reductions shared by all) is prepended to it, since NVRTC sees no
//! file system. Every kernel is `extern "C"`, so its PTX entry has the name listed here.

/// Text prepended to every source (`kernels/common.cuh`).
pub const COMMON: &str = include_str!("kernels/common.cuh");

/// One NVRTC program: a `.cu` file and the kernels it defines.
#[derive(Debug, Clone, Copy)]
pub struct KernelSource {
    /// The file name under `src/cuda/kernels/`.
    pub name: &'static str,
    /// The file's text (without [`COMMON`]).
    pub text: &'static str,
    /// The `extern "C" __global__` functions it defines, in file order.
    pub functions: &'static [&'static str],
}

impl KernelSource {
    /// The full program NVRTC compiles: [`COMMON`] then the file.
    #[must_use]
    pub fn program(&self) -> String {
        format!("{COMMON}\n{}", self.text)
    }
}

/// Every kernel source of the backend.
pub const SOURCES: &[KernelSource] = &[
    KernelSource {
        name: "encoder.cu",
        text: include_str!("kernels/encoder.cu"),
        functions: &[
            "encoder_forward",
            "encoder_backward_wpe",
            "encoder_backward_wte_check",
            "encoder_backward_wte_grouped",
            "encoder_backward_wte",
        ],
    },
    KernelSource {
        name: "layernorm.cu",
        text: include_str!("kernels/layernorm.cu"),
        functions: &[
            "layernorm_forward",
            "layernorm_backward_input",
            "layernorm_backward_params_partials",
            "layernorm_backward_params_finish",
        ],
    },
    KernelSource {
        name: "matmul.cu",
        text: include_str!("kernels/matmul.cu"),
        functions: &[
            "bias_broadcast",
            "bias_backward_partials",
            "bias_backward_finish",
        ],
    },
    KernelSource {
        name: "attention.cu",
        text: include_str!("kernels/attention.cu"),
        functions: &[
            "attention_split_heads",
            "attention_merge_heads",
            "attention_softmax_forward",
            "attention_softmax_backward",
        ],
    },
    KernelSource {
        name: "gelu.cu",
        text: include_str!("kernels/gelu.cu"),
        functions: &["gelu_forward", "gelu_backward"],
    },
    KernelSource {
        name: "residual.cu",
        text: include_str!("kernels/residual.cu"),
        functions: &["residual_forward", "residual_backward"],
    },
    KernelSource {
        name: "cross_entropy.cu",
        text: include_str!("kernels/cross_entropy.cu"),
        functions: &["crossentropy_forward", "crossentropy_backward"],
    },
];

/// Architectures CI compiles every source for: A100 (sm_80) and H100/H200 (sm_90).
pub const CI_ARCHS: &[&str] = &["sm_80", "sm_90"];

/// NVRTC options of every program. `--fmad=false` stops the compiler from fusing a * b + c
/// into one rounding, which the CPU (Rust never contracts) does not do: without it no kernel
/// could match its CPU twin bit for bit. Division and square root stay IEEE (NVRTC's
/// default, stated so that a changed default cannot change results), denormals kept.
pub const NVRTC_OPTIONS: &[&str] = &[
    "--fmad=false",
    "--prec-div=true",
    "--prec-sqrt=true",
    "--ftz=false",
];

/// The kernel names a source defines, read from its text: each `extern "C" __global__ void
/// NAME(`. Used to check [`KernelSource::functions`] against the file.
#[must_use]
pub fn declared_kernels(text: &str) -> Vec<&str> {
    const MARK: &str = "extern \"C\" __global__ void ";
    text.match_indices(MARK)
        .filter_map(|(at, _)| {
            let rest = &text[at + MARK.len()..];
            rest.find('(').map(|end| rest[..end].trim())
        })
        .collect()
}

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
