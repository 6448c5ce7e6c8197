//! What each rank thread of this process computes on: the host, or (feature `cuda`, with
//! `--device cuda`) one GPU that every rank of the process shares, each rank with its own
//! stream, its own arena on the GPU and zero-comm's device-local collectives between them.
//!
//! On the GPU the trainer runs steps, evaluation and the closing sample. Checkpoints
//! (`--save`, `--resume`, `--init-from`, `--export-llmc`) read and write model states through
//! host views of the engine's arena, and activation offload stages through host memory, so
//! they are refused there with a clear error; so are MPI and NCCL ranks.

use super::config::{Backend, Device, TrainConfig};
use super::error::TrainError;

/// One rank's device.
pub(crate) enum RankDevice {
    /// Host memory and the CPU kernels.
    Cpu,
    /// A rank on the process's shared GPU.
    #[cfg(feature = "cuda")]
    Cuda(Box<cuda::CudaRank>),
}

/// One [`RankDevice`] per rank this process hosts (`ranks`), as `cfg.device` asks.
///
/// # Errors
/// `--device cuda` in a build without the `cuda` feature, with options the GPU path does not
/// support, or on a machine without a usable GPU (naming the missing library).
pub(crate) fn rank_devices(cfg: &TrainConfig, ranks: usize) -> Result<Vec<RankDevice>, TrainError> {
    match cfg.device {
        Device::Cpu => Ok((0..ranks).map(|_| RankDevice::Cpu).collect()),
        Device::Cuda => {
            refuse_unsupported_on_gpu(cfg)?;
            gpu_ranks(cfg, ranks)
        }
    }
}

/// The options `--device cuda` does not support yet, each named.
fn refuse_unsupported_on_gpu(cfg: &TrainConfig) -> Result<(), TrainError> {
    let refused = [
        (
            cfg.backend != Backend::Local,
            "--backend mpi/nccl (use the local backend)",
        ),
        (cfg.save.is_some(), "--save"),
        (cfg.resume.is_some(), "--resume"),
        (cfg.init_from.is_some(), "--init-from"),
        (cfg.export_llmc.is_some(), "--export-llmc"),
        (cfg.offload_activations, "--offload-activations"),
    ];
    let named: Vec<&str> = refused.iter().filter(|r| r.0).map(|r| r.1).collect();
    if named.is_empty() {
        return Ok(());
    }
    Err(TrainError::Unsupported(format!(
        "--device cuda does not support {} yet: on the GPU, zero-train runs training steps, \
         evaluation and the closing sample only",
        named.join(", ")
    )))
}

#[cfg(not(feature = "cuda"))]
fn gpu_ranks(_cfg: &TrainConfig, _ranks: usize) -> Result<Vec<RankDevice>, TrainError> {
    Err(TrainError::Unsupported(
        "--device cuda needs a build with `--features cuda` (cargo build --release -p \
         zero-train --features cuda)"
            .into(),
    ))
}

#[cfg(feature = "cuda")]
fn gpu_ranks(_cfg: &TrainConfig, ranks: usize) -> Result<Vec<RankDevice>, TrainError> {
    let ranks = cuda::ranks(ranks, zero_comm::Config::default())?;
    Ok(ranks
        .into_iter()
        .map(|r| RankDevice::Cuda(Box::new(r)))
        .collect())
}

#[cfg(feature = "cuda")]
pub mod cuda {
    //! Ranks sharing GPU 0.

    use crate::error::TrainError;
    use zero::collectives::DeviceLocalCollectives;
    use zero::kernels::CudaKernels;
    use zero::EngineOps;
    use zero_gpt::cuda::CudaBackend;

    /// The GPU every rank of this process shares.
    const ORDINAL: usize = 0;

    /// What one rank computes with on the GPU. The model's kernels, the engine's kernels and
    /// the arena's copies all run on the context's default stream, in one order; the
    /// device-local collectives run on the rank's own stream and synchronise with it.
    #[derive(Debug)]
    pub struct CudaRank {
        /// The model's kernels, on the context's default stream.
        pub backend: CudaBackend,
        /// The engine's device, kernels and collectives.
        pub ops: EngineOps,
    }

    /// `n` ranks on GPU 0, each to be moved into its own thread: the model's backend and the
    /// engine's ops (a CUDA arena, the engine's CUDA kernels, device-local collectives).
    ///
    /// # Errors
    /// A missing CUDA library or GPU (named), kernel compilation or stream creation errors.
    pub fn ranks(n: usize, config: zero_comm::Config) -> Result<Vec<CudaRank>, TrainError> {
        let backends = (0..n)
            .map(|_| CudaBackend::on_default_stream(ORDINAL))
            .collect::<Result<Vec<_>, _>>()?;
        let Some(first) = backends.first() else {
            return Ok(Vec::new());
        };
        let ctx = first.stream().context().clone();
        let comms = zero_comm::device_local::cuda::create(&ctx, n, config)?;
        backends
            .into_iter()
            .zip(comms)
            .map(|(backend, comm)| {
                let ops = EngineOps {
                    device: zero_alloc::Device::Cuda(ORDINAL),
                    kernels: Box::new(CudaKernels::new(ORDINAL)?),
                    collectives: Box::new(DeviceLocalCollectives::cuda(comm)),
                };
                Ok(CudaRank { backend, ops })
            })
            .collect()
    }
}
