//! zero-alloc's NVRTC compiles (no GPU needed): PTX and CUBIN of a small program, and a
//! program that does not compile returns the compiler's log. Without NVRTC the tests print
//! why they skipped, unless `ZERO_GPT_REQUIRE_NVRTC=1` (scripts/nvrtc-check.sh).
#![cfg(feature = "cuda")]

use zero_alloc::nvrtc::{check_cubin, nvrtc_or_skip, Program, BITWISE_OPTIONS, CI_ARCHS};
use zero_alloc::AllocError;

const SCALE: Program = Program {
    name: "scale.cu",
    prelude: "#define FACTOR 3.0f\n",
    text: "extern \"C\" __global__ void scale(float* x, unsigned n) {\n\
           unsigned i = blockIdx.x * blockDim.x + threadIdx.x;\n\
           if (i < n) x[i] *= FACTOR;\n}\n",
    functions: &["scale"],
    options: BITWISE_OPTIONS,
};

#[test]
fn a_program_compiles_to_ptx_and_to_a_cubin_for_every_ci_arch() {
    if !nvrtc_or_skip("a_program_compiles_to_ptx_and_to_a_cubin") {
        return;
    }
    for &arch in CI_ARCHS {
        let ptx = SCALE.compile(Some(arch)).unwrap().to_src();
        assert!(ptx.contains(&format!(".target {arch}")), "{ptx}");
        assert!(ptx.contains(".entry scale("), "{ptx}");
        // The prelude's FACTOR reached the compiler: 3.0f is 0x40400000.
        assert!(ptx.contains("0f40400000"), "{ptx}");
        let cubin = SCALE.compile_cubin(arch).unwrap();
        assert_eq!(&cubin[..4], b"\x7fELF");
        assert!(cubin.windows(5).any(|w| w == b"scale"));
        assert_eq!(check_cubin(&cubin, &["scale"]), Ok(()));
        assert_eq!(
            check_cubin(&cubin, &["absent"]),
            Err("no symbol absent".into())
        );
        assert!(check_cubin(b"PTX", &[]).is_err());
    }
}

#[test]
fn a_program_that_does_not_compile_returns_the_log_for_ptx_and_cubin() {
    if !nvrtc_or_skip("a_program_that_does_not_compile_returns_the_log") {
        return;
    }
    let broken = Program {
        text: "extern \"C\" __global__ void broken(float* x) { x[0] = undefined_name; }\n",
        name: "broken.cu",
        functions: &["broken"],
        ..SCALE
    };
    for result in [
        broken.compile(Some("sm_90")).map(|_| ()),
        broken.compile_cubin("sm_90").map(|_| ()),
    ] {
        match result {
            Err(AllocError::Nvrtc { program, arch, log }) => {
                assert_eq!((program, arch), ("broken.cu", "sm_90"));
                assert!(log.contains("undefined_name"), "{log}");
            }
            other => panic!("expected an NVRTC error, got {other:?}"),
        }
    }
}

#[test]
fn prebuilt_cubins_are_written_for_each_arch_and_selected_by_a_device_of_that_arch() {
    use zero_alloc::nvrtc::prebuilt::{image_source, ImageSource};
    use zero_alloc::nvrtc::{write_prebuilt, KernelSet};
    if !nvrtc_or_skip("prebuilt_cubins_are_written_and_selected") {
        return;
    }
    static SET: KernelSet = KernelSet {
        name: "prebuilt test",
        programs: &[SCALE],
    };
    let dir = std::env::temp_dir().join(format!("zero-prebuilt-{}", std::process::id()));
    let written = write_prebuilt(&dir, &[&SET], CI_ARCHS).unwrap();
    assert_eq!(written.len(), CI_ARCHS.len());
    // A device of capability 9.0 (an H100 or H200) selects the sm_90 file written above, and
    // that file is the program's machine code.
    let ImageSource::Prebuilt { path, arch } = image_source(&SCALE, (9, 0), Some(&dir)) else {
        panic!("no prebuilt image selected in {}", dir.display());
    };
    assert_eq!(arch, "sm_90");
    assert!(written.contains(&path), "{path:?} not among {written:?}");
    let image = std::fs::read(&path).unwrap();
    assert_eq!(check_cubin(&image, &["scale"]), Ok(()));
    assert_eq!(image, SCALE.compile_cubin("sm_90").unwrap());
    std::fs::remove_dir_all(&dir).unwrap();
}
