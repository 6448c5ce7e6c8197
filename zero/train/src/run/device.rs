//! What each rank thread of this process computes on: the host; or (feature `cuda`, with
//! `--device cuda`) one GPU that every rank of the process shares, each rank with its own
//! arena on the GPU and zero-comm's device-local collectives between them (each rank's
//! collectives on a stream of its own; every rank's model kernels, engine kernels and arena
//! copies on the context's one default stream, so the ranks' compute runs one after another
//! and an arena's synchronisation waits for every rank's queued work);
//! or (feature `cuda`, `--backend nccl --device cuda`, one process per GPU) the GPU of this
//! process's local rank, with NCCL between the processes and the launcher's host communicator
//! (TCP under torchrun, MPI under `mpirun`: `crate::run::launch`) for the engine's control traffic.
//!
//! On the GPU the trainer runs steps, evaluation, checkpoints (which copy model states
//! through the arena's byte copies, the path the CPU runs too), activation offload (a copy
//! stream, `crate::offload`) and the closing sample. The MPI and TCP backends (host memory)
//! are refused there with a clear error.
//!
//! NCCL's communicator is bound to the thread that made it, so a [`RankDevice`] carries only
//! what can cross threads (the communicator's unique id, the GPU's ordinal), and the engine's
//! ops are built in the rank's thread ([`cuda::CudaRank::into_parts`]).

use crate::cli::config::{Backend, Device, TrainConfig};
use crate::error::TrainError;

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
        Device::Cuda(_) => {
            refuse_unsupported_on_gpu(cfg)?;
            gpu_ranks(cfg, ranks)
        }
    }
}

/// The options `--device cuda` does not support yet, each named.
///
/// # Errors
/// [`TrainError::Unsupported`] naming every such option `cfg` asks for.
pub(crate) fn refuse_unsupported_on_gpu(cfg: &TrainConfig) -> Result<(), TrainError> {
    let refused = [
        (
            cfg.backend == Backend::Mpi,
            "--backend mpi (use the local backend, or nccl with one process per GPU)",
        ),
        (
            cfg.backend == Backend::Tcp,
            "--backend tcp, which moves host memory (use nccl with one process per GPU)",
        ),
    ];
    let named: Vec<&str> = refused.iter().filter(|r| r.0).map(|r| r.1).collect();
    if named.is_empty() {
        return Ok(());
    }
    Err(TrainError::Unsupported(format!(
        "--device cuda does not support {} yet (docs/gpu.md lists what the GPU path runs)",
        named.join(", ")
    )))
}

/// Refuses `--backend nccl` where something it needs is missing, naming it: `--device cuda`,
/// the `cuda` feature, or (before any peer is waited for) the CUDA driver, a GPU or NCCL. The
/// launcher is checked when the process joins (`crate::run::launch`).
///
/// # Errors
/// [`TrainError::Unsupported`] naming the missing flag or feature; the missing library.
pub(crate) fn nccl_prerequisites(cfg: &TrainConfig) -> Result<(), TrainError> {
    if !cfg.device.is_cuda() {
        return Err(TrainError::Unsupported(
            "--backend nccl needs --device cuda: NCCL moves GPU memory (on the CPU use \
             --backend local, tcp or mpi)"
                .into(),
        ));
    }
    if !cfg!(feature = "cuda") {
        return Err(TrainError::Unsupported(
            "--backend nccl needs a build with `--features cuda` (cargo build --release -p \
             zero-train --features cuda; add `mpi` to launch it with mpirun)"
                .into(),
        ));
    }
    refuse_unsupported_on_gpu(cfg)?;
    #[cfg(feature = "cuda")]
    zero_comm::nccl::available()?;
    Ok(())
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
fn gpu_ranks(cfg: &TrainConfig, ranks: usize) -> Result<Vec<RankDevice>, TrainError> {
    let math = cuda::gemm_math(cfg.precision.into());
    let ordinal = cfg.device.ordinal_or(0);
    let ranks = cuda::ranks(ordinal, ranks, cfg.comm_config()?, math)?;
    Ok(ranks
        .into_iter()
        .map(|r| RankDevice::Cuda(Box::new(r)))
        .collect())
}

/// This process's NCCL rank: rank 0's unique id broadcast over `control` (the job's host
/// communicator, `crate::run::launch`), the GPU `local_rank`. Collective over `control`.
///
/// # Errors
/// NCCL failing to make the id, a local rank past the machine's GPUs, a peer that does not
/// arrive within the communicator's timeout.
#[cfg(feature = "cuda")]
pub(crate) fn nccl_rank(
    cfg: &TrainConfig,
    control: &zero_comm::Communicator,
    local_rank: usize,
) -> Result<RankDevice, TrainError> {
    let (config, math) = (cfg.comm_config()?, cuda::gemm_math(cfg.precision.into()));
    let mut id: zero_comm::nccl::UniqueId = if control.rank() == 0 {
        zero_comm::nccl::new_id()?
    } else {
        [0; 128]
    };
    zero_comm::bootstrap::broadcast_id(control, &mut id, 0)?;
    let (rank, size) = (control.rank(), control.size());
    let ordinal = cfg.device.ordinal_or(local_rank);
    let rank = cuda::CudaRank::nccl(ordinal, id, rank, size, config, math)?;
    Ok(RankDevice::Cuda(Box::new(rank)))
}

#[cfg(feature = "cuda")]
pub mod cuda {
    //! GPU ranks: threads sharing GPU 0 (device-local collectives), or one NCCL rank per
    //! process.

    use crate::error::TrainError;
    use zero::collectives::{Collectives, DeviceLocalCollectives};
    use zero::kernels::CudaKernels;
    use zero::EngineOps;
    use zero_comm::device_local::cuda::CudaOps;
    use zero_comm::device_local::DeviceLocalComm;
    use zero_gpt::cuda::{CudaBackend, GemmMath};

    /// What one rank computes with on the GPU, every part of it `Send`: the engine's ops are
    /// built in the rank's thread by [`CudaRank::into_parts`]. The model's kernels, the
    /// engine's kernels and the arena's copies all run on the context's default stream, in one
    /// order; the collectives run on their own stream and are waited for.
    #[derive(Debug)]
    pub struct CudaRank {
        backend: CudaBackend,
        kernels: CudaKernels,
        ordinal: usize,
        peers: Peers,
    }

    /// How a rank reaches its peers.
    #[derive(Debug)]
    enum Peers {
        /// Threads of this process on the same GPU.
        DeviceLocal(DeviceLocalComm<CudaOps>),
        /// One NCCL rank per GPU: what joining the group takes (made in the rank's thread).
        Nccl {
            id: zero_comm::nccl::UniqueId,
            rank: usize,
            size: usize,
            config: zero_comm::Config,
        },
    }

    impl CudaRank {
        /// One NCCL rank on GPU `ordinal`, to join the group `id` in its thread.
        ///
        /// # Errors
        /// A missing CUDA library or GPU (named), kernel compilation errors.
        pub(crate) fn nccl(
            ordinal: usize,
            id: zero_comm::nccl::UniqueId,
            rank: usize,
            size: usize,
            config: zero_comm::Config,
            math: GemmMath,
        ) -> Result<Self, TrainError> {
            Ok(Self {
                backend: CudaBackend::on_default_stream(ordinal)?.with_gemm_math(math),
                kernels: CudaKernels::new(ordinal)?,
                ordinal,
                peers: Peers::Nccl {
                    id,
                    rank,
                    size,
                    config,
                },
            })
        }

        /// The model's backend and the engine's ops (a CUDA arena, the engine's CUDA kernels,
        /// the rank's collectives). Call it in the rank's thread: NCCL's communicator is
        /// created here, collectively with every rank's call, and stays on this thread.
        ///
        /// # Errors
        /// NCCL failing to create the communicator (a missing library, a rank that does not
        /// join within the timeout).
        pub fn into_parts(self) -> Result<(CudaBackend, EngineOps), TrainError> {
            let collectives: Box<dyn Collectives> = match self.peers {
                Peers::DeviceLocal(comm) => Box::new(DeviceLocalCollectives::cuda(comm)),
                Peers::Nccl {
                    id,
                    rank,
                    size,
                    config,
                } => {
                    let comm =
                        zero_comm::nccl::NcclComm::from_id(&id, rank, size, self.ordinal, config)?;
                    Box::new(zero::collectives::NcclCollectives::new(comm))
                }
            };
            let ops = EngineOps {
                device: zero_alloc::Device::Cuda(self.ordinal),
                kernels: Box::new(self.kernels),
                collectives,
                nvme_path: None,
            };
            Ok((self.backend, ops))
        }
    }

    /// The math mode of the model's matrix products for a storage precision: fp32 exactly;
    /// bf16 as the engine stores (autocast's rule: inputs rounded to bf16 on tensor cores,
    /// fp32 accumulation); fp16 in TF32, because the model's backward starts from unscaled
    /// 1/N loss gradients, which fp16 inputs would flush to zero (the engine's loss scale
    /// applies to the accumulated gradients, not inside the model).
    #[must_use]
    pub fn gemm_math(precision: zero::Precision) -> GemmMath {
        match precision {
            zero::Precision::Fp32 => GemmMath::Exact,
            zero::Precision::Bf16 => GemmMath::Bf16,
            zero::Precision::Fp16 => GemmMath::Tf32,
        }
    }

    /// `n` ranks on GPU `ordinal`, each to be moved into its own thread: the model's backend (its
    /// products in `math` mode), the engine's kernels and a device-local peer.
    ///
    /// # Errors
    /// A missing CUDA library or GPU (named), kernel compilation or stream creation errors.
    pub fn ranks(
        ordinal: usize,
        n: usize,
        config: zero_comm::Config,
        math: GemmMath,
    ) -> Result<Vec<CudaRank>, TrainError> {
        let backends = (0..n)
            .map(|_| Ok(CudaBackend::on_default_stream(ordinal)?.with_gemm_math(math)))
            .collect::<Result<Vec<_>, TrainError>>()?;
        let Some(first) = backends.first() else {
            return Ok(Vec::new());
        };
        let ctx = first.stream().context().clone();
        let comms = zero_comm::device_local::cuda::create(&ctx, n, config)?;
        backends
            .into_iter()
            .zip(comms)
            .map(|(backend, comm)| {
                Ok(CudaRank {
                    backend,
                    kernels: CudaKernels::new(ordinal)?,
                    ordinal,
                    peers: Peers::DeviceLocal(comm),
                })
            })
            .collect()
    }
}
