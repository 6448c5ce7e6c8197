//! Compiles every CUDA kernel source with NVRTC for each CI architecture (no GPU needed).
//!
//! Where NVRTC is not installed the tests print that they skipped and why, unless
//! `ZERO_GPT_REQUIRE_NVRTC=1` (set by scripts/nvrtc-check.sh), which turns the skip into a
//! failure so that CI cannot pass without compiling.

#![cfg(feature = "cuda")]

use zero_alloc::nvrtc::{check_cubin, nvrtc_or_skip, Program, BITWISE_OPTIONS};
use zero_alloc::{AllocError, CudaLibrary as Library};
use zero_gpt::cuda::sources::{CI_ARCHS, COMMON, SOURCES};
use zero_gpt::GptError;

#[test]
fn every_kernel_source_compiles_for_every_ci_arch() {
    if !nvrtc_or_skip("every_kernel_source_compiles_for_every_ci_arch") {
        return;
    }
    let mut kernels = 0;
    for &arch in CI_ARCHS {
        for src in SOURCES {
            let ptx = match src.compile(Some(arch)) {
                Ok(ptx) => ptx.to_src(),
                Err(e) => panic!("{e}"),
            };
            assert!(
                ptx.contains(&format!(".target {arch}")),
                "{}: PTX not for {arch}",
                src.name
            );
            for f in src.functions {
                assert!(
                    ptx.contains(&format!(".entry {f}(")),
                    "{}: no PTX entry {f}",
                    src.name
                );
                kernels += 1;
            }
        }
    }
    let per_arch = SOURCES.iter().map(|s| s.functions.len()).sum::<usize>();
    assert_eq!(kernels, per_arch * CI_ARCHS.len());
    println!(
        "NVRTC compiled {} sources ({per_arch} kernels) for {:?}: {kernels} kernel entries",
        SOURCES.len(),
        CI_ARCHS
    );
}

#[test]
fn a_source_that_does_not_compile_returns_the_compiler_log() {
    if !nvrtc_or_skip("a_source_that_does_not_compile_returns_the_compiler_log") {
        return;
    }
    let broken = Program {
        name: "broken.cu",
        prelude: COMMON,
        text: "extern \"C\" __global__ void broken(float* x) { x[0] = undefined_name; }\n",
        functions: &["broken"],
        options: BITWISE_OPTIONS,
    };
    match broken.compile(Some("sm_90")) {
        Err(AllocError::Nvrtc { program, arch, log }) => {
            assert_eq!((program, arch), ("broken.cu", "sm_90"));
            assert!(log.contains("undefined_name"), "{log}");
        }
        other => panic!("expected an NVRTC error, got {other:?}"),
    }
}

#[test]
fn the_backend_names_the_missing_library_instead_of_panicking() {
    // Holds on machines without a driver (CI); on a GPU machine the backend may start.
    match zero_gpt::cuda::CudaBackend::new(0) {
        Err(GptError::CudaUnavailable { library, reason }) => {
            assert!(
                ["libcuda", "libcublas", "libnvrtc"].contains(&library),
                "{library}"
            );
            println!("CudaBackend::new(0): {library}: {reason}");
        }
        Err(other) => println!("CudaBackend::new(0) failed otherwise: {other}"),
        Ok(_) => assert!(Library::Driver.is_present()),
    }
    if !Library::Driver.is_present() {
        assert!(matches!(
            zero_gpt::cuda::CudaBackend::new(0),
            Err(GptError::CudaUnavailable {
                library: "libcuda",
                ..
            })
        ));
    }
}

#[test]
fn every_kernel_source_assembles_to_a_cubin_for_every_ci_arch() {
    if !nvrtc_or_skip("every_kernel_source_assembles_to_a_cubin_for_every_ci_arch") {
        return;
    }
    for &arch in CI_ARCHS {
        for src in SOURCES {
            let cubin = match src.compile_cubin(arch) {
                Ok(cubin) => cubin,
                Err(e) => panic!("{e}"),
            };
            if let Err(why) = check_cubin(&cubin, src.functions) {
                panic!("{} for {arch}: {why}", src.name);
            }
        }
    }
}
