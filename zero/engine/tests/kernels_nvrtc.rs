//! Compiles the engine's CUDA kernels with NVRTC for each CI architecture (no GPU needed).
//!
//! Where NVRTC is not installed the tests print that they skipped and why, unless
//! `ZERO_GPT_REQUIRE_NVRTC=1` (set by scripts/nvrtc-check.sh), which turns the skip into a
//! failure so that CI cannot pass without compiling.

#![cfg(feature = "cuda")]

use zero::kernels::cuda::{ENGINE_KERNELS, ENGINE_PROGRAM};
use zero_alloc::nvrtc::{check_cubin, nvrtc_or_skip, CI_ARCHS};
use zero_alloc::AllocError;

/// The names after each `.entry` of a PTX text, in order.
fn ptx_entries(ptx: &str) -> Vec<String> {
    ptx.match_indices(".entry ")
        .filter_map(|(at, mark)| {
            let rest = &ptx[at + mark.len()..];
            rest.find('(').map(|end| rest[..end].trim().to_string())
        })
        .collect()
}

#[test]
fn the_engine_source_compiles_for_every_ci_arch_with_exactly_the_listed_kernels() {
    if !nvrtc_or_skip("the_engine_source_compiles_for_every_ci_arch") {
        return;
    }
    let mut listed: Vec<String> = ENGINE_KERNELS.iter().map(|s| (*s).to_string()).collect();
    listed.sort_unstable();
    for &arch in CI_ARCHS {
        let ptx = match ENGINE_PROGRAM.compile(Some(arch)) {
            Ok(ptx) => ptx.to_src(),
            Err(e) => panic!("{e}"),
        };
        assert!(
            ptx.contains(&format!(".target {arch}")),
            "PTX not for {arch}"
        );
        let mut entries = ptx_entries(&ptx);
        entries.sort_unstable();
        assert_eq!(
            entries, listed,
            "{arch}: PTX entries differ from ENGINE_KERNELS"
        );
    }
    println!(
        "NVRTC compiled engine.cu ({} kernels) for {CI_ARCHS:?}",
        ENGINE_KERNELS.len()
    );
}

#[test]
fn compiled_element_wise_kernels_use_no_fused_multiply_add() {
    if !nvrtc_or_skip("compiled_element_wise_kernels_use_no_fused_multiply_add") {
        return;
    }
    // --fmad=false is what makes the element-wise kernels bitwise with the host: a fused
    // a * b + c in f32 would show up as fma.rn.f32 in the PTX.
    let ptx = match ENGINE_PROGRAM.compile(Some("sm_90")) {
        Ok(ptx) => ptx.to_src(),
        Err(e) => panic!("{e}"),
    };
    assert!(ptx.contains("mul.rn.f32") || ptx.contains("mul.f32"));
    assert!(!ptx.contains("fma.rn.f32"), "an f32 fma was emitted");
}

#[test]
fn an_unknown_architecture_is_an_error_with_the_compiler_log_not_a_panic() {
    if !nvrtc_or_skip("an_unknown_architecture_is_an_error") {
        return;
    }
    match ENGINE_PROGRAM.compile(Some("sm_1")) {
        Err(AllocError::Nvrtc { program, arch, log }) => {
            assert_eq!((program, arch), ("engine.cu", "sm_1"));
            assert!(!log.is_empty());
        }
        other => panic!("expected an NVRTC error, got {other:?}"),
    }
}

#[test]
fn the_engine_source_assembles_to_a_cubin_with_every_kernel_for_every_ci_arch() {
    if !nvrtc_or_skip("the_engine_source_assembles_to_a_cubin") {
        return;
    }
    for &arch in CI_ARCHS {
        let cubin = match ENGINE_PROGRAM.compile_cubin(arch) {
            Ok(cubin) => cubin,
            Err(e) => panic!("{e}"),
        };
        if let Err(why) = check_cubin(&cubin, ENGINE_KERNELS) {
            panic!("{arch}: {why}");
        }
    }
}
