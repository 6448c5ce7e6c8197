//! `zero-cubins`: every CUDA kernel program of the workspace compiled ahead of time by NVRTC
//! (no GPU needed), one CUBIN a program and architecture, into a folder that a GPU machine's
//! processes find through `ZERO_CUBIN_DIR` instead of compiling again.
//!
//! ```text
//! zero-cubins --out gpu-bin/cubin              # sm_80 and sm_90 (CI's architectures)
//! zero-cubins --out dir --arch sm_90 --arch sm_86
//! ```
//! `scripts/gpu-check.sh build` runs it with NVRTC from the PyPI wheel.
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use zero_alloc::nvrtc::{write_prebuilt, KernelSet, CI_ARCHS, KNOWN_ARCHS};

#[derive(Debug, Parser)]
#[command(
    version,
    about = "Compile every CUDA kernel program of the workspace to CUBINs"
)]
struct Args {
    /// The folder to write into (created if missing).
    #[arg(long)]
    out: PathBuf,
    /// An architecture to compile for (`sm_90`), repeatable; default sm_80 and sm_90.
    #[arg(long = "arch")]
    archs: Vec<String>,
}

/// Every kernel set a process of the workspace loads.
fn kernel_sets() -> [&'static KernelSet; 3] {
    [
        &zero_gpt::cuda::sources::KERNELS,
        &zero::kernels::cuda::ENGINE_KERNEL_SET,
        &zero_comm::device_local::cuda::REDUCE_SET,
    ]
}

/// The `sm_XY` names of `given` as zero-alloc knows them (so that a device selects them), or
/// the one that is not known.
fn known_archs(given: &[String]) -> Result<Vec<&'static str>, String> {
    if given.is_empty() {
        return Ok(CI_ARCHS.to_vec());
    }
    let names: Vec<&'static str> = KNOWN_ARCHS.iter().map(|&(_, name)| name).collect();
    given
        .iter()
        .map(|a| {
            names.iter().copied().find(|n| n == a).ok_or_else(|| {
                format!("--arch {a}: not an architecture this build knows ({names:?})")
            })
        })
        .collect()
}

fn main() -> ExitCode {
    let args = Args::parse();
    let archs = match known_archs(&args.archs) {
        Ok(archs) => archs,
        Err(e) => {
            eprintln!("zero-cubins: {e}");
            return ExitCode::from(2);
        }
    };
    match write_prebuilt(&args.out, &kernel_sets(), &archs) {
        Ok(files) => {
            println!(
                "zero-cubins: {} CUBINs for {archs:?} in {}",
                files.len(),
                args.out.display()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("zero-cubins: {e}");
            ExitCode::FAILURE
        }
    }
}
