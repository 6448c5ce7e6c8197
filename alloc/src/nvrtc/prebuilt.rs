//! CUBINs compiled ahead of time: where a folder of them keeps each program's image, and
//! which image a device loads. Needs no CUDA, so the choice is tested on any machine.
//!
//! Why: NVRTC needs no GPU, but every process that loads a [`KernelSet`](super::KernelSet)
//! would otherwise compile it again (about 3 s for the workspace's nine programs). On a GPU
//! machine lent for minutes, `scripts/gpu-check.sh build` compiles every program here for
//! [`CI_ARCHS`](super::CI_ARCHS) into a folder that travels with the binaries, and the
//! processes there find it through [`PREBUILT_DIR_VAR`].
//!
//! A file's name holds the program's name, the architecture and a 64-bit FNV-1a hash of
//! everything that makes the image (the full source, the options, the architecture), so a
//! CUBIN of another source or option set is never chosen: it is simply not found.

use std::path::{Path, PathBuf};

use super::{arch_for, Program};

/// The environment variable naming a folder of prebuilt CUBINs (`gpu-check.sh run` sets it).
pub const PREBUILT_DIR_VAR: &str = "ZERO_CUBIN_DIR";

/// 64-bit FNV-1a over `bytes`, continuing from `hash`. Chosen because it is a few lines with
/// published test vectors and stable across Rust versions (std's hashers promise neither).
fn fnv1a64(mut hash: u64, bytes: &[u8]) -> u64 {
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    for &b in bytes {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(PRIME);
    }
    hash
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// The hash of what makes `program`'s image for `arch`: the source, each option and the
/// architecture, each followed by a NUL so that no two different lists hash the same text.
#[must_use]
pub fn image_key(program: &Program, arch: &str) -> u64 {
    let mut hash = fnv1a64(FNV_OFFSET, program.source().as_bytes());
    for part in program.options.iter().copied().chain([arch]) {
        hash = fnv1a64(fnv1a64(hash, &[0]), part.as_bytes());
    }
    hash
}

/// The file name of `program`'s prebuilt CUBIN for `arch` (`engine.cu-sm_90-<hash>.cubin`).
#[must_use]
pub fn cubin_file_name(program: &Program, arch: &str) -> String {
    format!(
        "{}-{arch}-{:016x}.cubin",
        program.name,
        image_key(program, arch)
    )
}

/// Where a device's image of a program comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageSource {
    /// A CUBIN compiled ahead of time for this architecture and this exact source.
    Prebuilt {
        /// The file.
        path: PathBuf,
        /// Its architecture (what NVRTC compiles for if the driver refuses the file).
        arch: &'static str,
    },
    /// No prebuilt file: NVRTC compiles a CUBIN for this known architecture.
    CompileCubin(&'static str),
    /// An architecture [`arch_for`] does not know: NVRTC writes PTX for the driver's JIT.
    CompilePtx,
}

/// The image a device of compute capability `(major, minor)` loads for `program`: the
/// prebuilt CUBIN in `prebuilt` when one for its architecture and this source exists, else
/// what NVRTC compiles there.
#[must_use]
pub fn image_source(
    program: &Program,
    (major, minor): (i32, i32),
    prebuilt: Option<&Path>,
) -> ImageSource {
    let Some(arch) = arch_for(major, minor) else {
        return ImageSource::CompilePtx;
    };
    prebuilt
        .map(|dir| dir.join(cubin_file_name(program, arch)))
        .filter(|path| path.is_file())
        .map_or(ImageSource::CompileCubin(arch), |path| {
            ImageSource::Prebuilt { path, arch }
        })
}

/// The folder [`PREBUILT_DIR_VAR`] names, if it is set and not empty.
#[must_use]
pub fn prebuilt_dir_from_env() -> Option<PathBuf> {
    std::env::var_os(PREBUILT_DIR_VAR)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROGRAM: Program = Program {
        name: "p.cu",
        prelude: "",
        text: "extern \"C\" __global__ void k() {}",
        functions: &["k"],
        options: &["--fmad=false"],
    };

    #[test]
    fn fnv1a64_matches_the_published_test_vectors() {
        assert_eq!(fnv1a64(FNV_OFFSET, b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(FNV_OFFSET, b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(FNV_OFFSET, b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn the_key_changes_with_the_source_the_options_and_the_architecture() {
        let base = image_key(&PROGRAM, "sm_90");
        let other_text = Program {
            text: "extern \"C\" __global__ void k() { }",
            ..PROGRAM
        };
        let other_options = Program {
            options: &["--fmad=true"],
            ..PROGRAM
        };
        let other_prelude = Program {
            prelude: "#define X 1",
            ..PROGRAM
        };
        assert_ne!(base, image_key(&other_text, "sm_90"));
        assert_ne!(base, image_key(&other_options, "sm_90"));
        assert_ne!(base, image_key(&other_prelude, "sm_90"));
        assert_ne!(base, image_key(&PROGRAM, "sm_80"));
        // An option list is not a text: ["a", "b"] and ["ab"] differ.
        let split = Program {
            options: &["--a", "--b"],
            ..PROGRAM
        };
        let joined = Program {
            options: &["--a--b"],
            ..PROGRAM
        };
        assert_ne!(image_key(&split, "sm_90"), image_key(&joined, "sm_90"));
    }

    /// A folder holding a CUBIN of [`PROGRAM`] for each of `archs`, named as the build
    /// writes them.
    fn folder_with(archs: &[&str]) -> Folder {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("zero-cubins-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for arch in archs {
            let name = cubin_file_name(&PROGRAM, arch);
            assert!(name.starts_with("p.cu-") && name.contains(arch), "{name}");
            std::fs::write(dir.join(name), b"\x7fELF").unwrap();
        }
        Folder(dir)
    }

    /// A scratch folder removed when the test ends.
    struct Folder(PathBuf);

    impl Folder {
        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Folder {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn a_device_of_capability_9_0_selects_the_sm_90_cubin_built_for_it() {
        let dir = folder_with(&["sm_80", "sm_90"]);
        let picked = image_source(&PROGRAM, (9, 0), Some(dir.path()));
        let ImageSource::Prebuilt { path, arch } = picked else {
            panic!("expected the prebuilt sm_90 file, got {picked:?}");
        };
        let name = path.file_name().unwrap().to_str().unwrap();
        assert!(name.starts_with("p.cu-sm_90-"), "{name}");
        assert_eq!(path.parent(), Some(dir.path()));
        assert_eq!(arch, "sm_90");
        let for_a100 = image_source(&PROGRAM, (8, 0), Some(dir.path()));
        assert!(
            matches!(&for_a100, ImageSource::Prebuilt { path, arch: "sm_80" }
            if path.file_name().unwrap().to_str().unwrap().starts_with("p.cu-sm_80-"))
        );
    }

    #[test]
    fn other_devices_and_other_sources_compile_instead() {
        let dir = folder_with(&["sm_80", "sm_90"]);
        // sm_86 was not built ahead: NVRTC compiles it.
        assert_eq!(
            image_source(&PROGRAM, (8, 6), Some(dir.path())),
            ImageSource::CompileCubin("sm_86")
        );
        // An architecture arch_for does not know gets PTX.
        assert_eq!(
            image_source(&PROGRAM, (6, 1), Some(dir.path())),
            ImageSource::CompilePtx
        );
        // A changed source never loads the old file.
        let edited = Program {
            text: "extern \"C\" __global__ void k() { return; }",
            ..PROGRAM
        };
        assert_eq!(
            image_source(&edited, (9, 0), Some(dir.path())),
            ImageSource::CompileCubin("sm_90")
        );
        // No folder: compile.
        assert_eq!(
            image_source(&PROGRAM, (9, 0), None),
            ImageSource::CompileCubin("sm_90")
        );
    }
}
