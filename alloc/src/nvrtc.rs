//! CUDA C programs compiled at run time by NVRTC, and the per-device cache of their loaded
//! kernels: the one place where the workspace's kernel sources (zero-gpt's model, the
//! engine's optimizer passes, zero-comm's device-local reduction) become functions a stream
//! can launch. The descriptions ([`Program`], [`KernelSet`], [`arch_for`]) need no CUDA and
//! are always compiled; compiling and loading need the feature `cuda`.
//!
//! A [`KernelSet`] is compiled once per process and device, for the device's own
//! architecture, the first time it is loaded there; later loads share the functions.
//! Rejected: compiling each kernel on first launch, which would put a compiler run (tens of
//! milliseconds) inside the first training step. NVRTC needs no GPU, so CI compiles every
//! program for [`CI_ARCHS`] on a machine without one, and a folder of CUBINs compiled ahead
//! ([`prebuilt`]) spares a GPU machine the compiler altogether.

#[cfg(feature = "cuda")]
mod cubin;
#[cfg(feature = "cuda")]
mod load;
pub mod prebuilt;
#[cfg(feature = "cuda")]
mod test_support;

#[cfg(feature = "cuda")]
pub use cubin::write_prebuilt;
#[cfg(feature = "cuda")]
pub use load::LoadedKernels;
#[cfg(feature = "cuda")]
#[doc(hidden)]
pub use test_support::{check_cubin, nvrtc_or_skip};

/// Architectures CI compiles every program for: A100 (sm_80) and H100/H200 (sm_90).
pub const CI_ARCHS: &[&str] = &["sm_80", "sm_90"];

/// NVRTC options of programs whose kernels match a CPU twin bit for bit. `--fmad=false`
/// stops the compiler from fusing `a * b + c` into one rounding, which Rust never does;
/// division and square root stay IEEE and denormals are kept (NVRTC's defaults, stated so
/// that a changed default cannot change results).
pub const BITWISE_OPTIONS: &[&str] = &[
    "--fmad=false",
    "--prec-div=true",
    "--prec-sqrt=true",
    "--ftz=false",
];

/// One NVRTC program: a `.cu` text, the text put before it (NVRTC sees no file system, so
/// shared helpers are prepended instead of included), its options and its kernels.
#[derive(Debug, Clone, Copy)]
pub struct Program {
    /// The file name, as compiler logs and errors show it.
    pub name: &'static str,
    /// Text compiled before [`Program::text`] (empty when none).
    pub prelude: &'static str,
    /// The file's text.
    pub text: &'static str,
    /// The `extern "C" __global__` functions it defines: the PTX entries it must produce.
    pub functions: &'static [&'static str],
    /// NVRTC options (`--fmad=false`, ...).
    pub options: &'static [&'static str],
}

impl Program {
    /// The full text NVRTC compiles: the prelude, then the file.
    #[must_use]
    pub fn source(&self) -> String {
        if self.prelude.is_empty() {
            self.text.to_string()
        } else {
            format!("{}\n{}", self.prelude, self.text)
        }
    }
}

/// The kernel names a CUDA text defines, read from it: each `extern "C" __global__ void
/// NAME(`. Tests check [`Program::functions`] against the file with it (kernels stamped by
/// a macro are not found this way).
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

/// The architectures known here: compute capability (major, minor) and the `sm_XY` name
/// NVRTC takes for it.
pub const KNOWN_ARCHS: &[((i32, i32), &str)] = &[
    ((7, 5), "sm_75"),
    ((8, 0), "sm_80"),
    ((8, 6), "sm_86"),
    ((8, 9), "sm_89"),
    ((9, 0), "sm_90"),
    ((10, 0), "sm_100"),
    ((12, 0), "sm_120"),
];

/// The `sm_XY` name NVRTC takes for compute capability (major, minor) among
/// [`KNOWN_ARCHS`]; `None` (NVRTC's default target, JIT-compiled by the driver) otherwise.
#[must_use]
pub fn arch_for(major: i32, minor: i32) -> Option<&'static str> {
    KNOWN_ARCHS
        .iter()
        .find(|(cc, _)| *cc == (major, minor))
        .map(|&(_, name)| name)
}

/// The programs one crate loads together; `name` keys the per-device cache, so it is unique
/// in the process.
#[derive(Debug)]
pub struct KernelSet {
    /// A name unique among the process's sets (`"zero-gpt"`, ...).
    pub name: &'static str,
    /// Its programs.
    pub programs: &'static [Program],
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_compute_capabilities_map_to_their_sm_name() {
        assert_eq!(arch_for(9, 0), Some("sm_90"));
        assert_eq!(arch_for(8, 0), Some("sm_80"));
        assert_eq!(arch_for(6, 1), None);
        for arch in CI_ARCHS {
            let digits = arch.trim_start_matches("sm_");
            let (major, minor) = digits.split_at(digits.len() - 1);
            assert_eq!(
                arch_for(major.parse().unwrap(), minor.parse().unwrap()),
                Some(*arch)
            );
        }
    }

    #[test]
    fn declared_kernels_reads_each_extern_c_global_name() {
        let text = "extern \"C\" __global__ void a_1(int x) {}\n__device__ void helper() {}\n\
                    extern \"C\" __global__ void b (float* y) {}";
        assert_eq!(declared_kernels(text), ["a_1", "b"]);
    }

    #[test]
    fn the_source_is_the_prelude_then_the_text() {
        let p = Program {
            name: "p.cu",
            prelude: "P",
            text: "T",
            functions: &[],
            options: &[],
        };
        assert_eq!(p.source(), "P\nT");
        assert_eq!(Program { prelude: "", ..p }.source(), "T");
    }
}
