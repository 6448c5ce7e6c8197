//! Compiles the device-local reduction kernel with NVRTC for the CI architectures, to PTX and
//! to a CUBIN (no GPU needed). Without NVRTC it prints why it skipped, unless
//! `ZERO_GPT_REQUIRE_NVRTC=1`.

#![cfg(feature = "cuda")]

use zero_alloc::nvrtc::{check_cubin, nvrtc_or_skip, CI_ARCHS};
use zero_comm::device_local::cuda::{REDUCE_KERNELS, REDUCE_PROGRAM};

#[test]
fn the_reduction_kernel_compiles_for_every_ci_arch() {
    if !nvrtc_or_skip("the_reduction_kernel_compiles_for_every_ci_arch") {
        return;
    }
    for &arch in CI_ARCHS {
        let src = match REDUCE_PROGRAM.compile(Some(arch)) {
            Ok(p) => p.to_src(),
            Err(e) => panic!("{arch}: {e}"),
        };
        assert!(
            src.contains(&format!(".target {arch}")),
            "PTX not for {arch}"
        );
        for k in REDUCE_KERNELS {
            assert!(
                src.contains(&format!(".entry {k}(")),
                "{arch}: no .entry {k}"
            );
        }
    }
}

#[test]
fn the_reduction_kernel_assembles_to_a_cubin_for_every_ci_arch() {
    if !nvrtc_or_skip("the_reduction_kernel_assembles_to_a_cubin") {
        return;
    }
    for &arch in CI_ARCHS {
        let cubin = match REDUCE_PROGRAM.compile_cubin(arch) {
            Ok(cubin) => cubin,
            Err(e) => panic!("{arch}: {e}"),
        };
        if let Err(why) = check_cubin(&cubin, &REDUCE_KERNELS) {
            panic!("{arch}: {why}");
        }
    }
}
