//! What each rank thread of this process computes on: the host; or (feature `cuda`, with
//! `--device cuda`) one GPU that every rank of the process shares, each rank with its own
//! stream, its own arena on the GPU and zero-comm's device-local collectives between them;
//! or (features `cuda` and `mpi`, `--backend nccl --device cuda` under `mpirun`) the GPU of
//! this process's local rank, with NCCL between the processes and MPI for the engine's
//! control traffic.
//!
//! On the GPU the trainer runs steps, evaluation, checkpoints (which copy model states
//! through the arena's byte copies, the path the CPU runs too), activation offload (a copy
//! stream, `crate::offload`) and the closing sample. MPI ranks on the GPU are refused with a
//! clear error.
//!
//! NCCL's communicator is bound to the thread that made it, so a [`RankDevice`] carries only
//! what can cross threads (the communicator's unique id, the GPU's ordinal), and the engine's
//! ops are built in the rank's thread ([`cuda::CudaRank::into_parts`]).

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
    let refused = [(
        cfg.backend == Backend::Mpi,
        "--backend mpi (use the local backend, or nccl under mpirun)",
    )];
    let named: Vec<&str> = refused.iter().filter(|r| r.0).map(|r| r.1).collect();
    if named.is_empty() {
        return Ok(());
    }
    Err(TrainError::Unsupported(format!(
        "--device cuda does not support {} yet (docs/gpu.md lists what the GPU path runs)",
        named.join(", ")
    )))
}

/// Refuses `--backend nccl` where something it needs is missing, naming it: `--device
/// cuda`, the `cuda` feature, or the `mpi` feature (a torchrun-style launch gives the engine
/// no host communicator for its control traffic).
///
/// # Errors
/// [`TrainError::Unsupported`] naming the missing flag or feature.
pub(crate) fn nccl_prerequisites(cfg: &TrainConfig) -> Result<(), TrainError> {
    if cfg.device != Device::Cuda {
        return Err(TrainError::Unsupported(
            "--backend nccl needs --device cuda: NCCL moves GPU memory (on the CPU use \
             --backend local or mpi)"
                .into(),
        ));
    }
    if !cfg!(feature = "cuda") {
        return Err(TrainError::Unsupported(
            "--backend nccl needs a build with `--features cuda,mpi` (cargo build --release \
             -p zero-train --features cuda,mpi), launched by mpirun"
                .into(),
        ));
    }
    if !cfg!(feature = "mpi") {
        return Err(TrainError::Unsupported(NO_CONTROL_COMMUNICATOR.into()));
    }
    refuse_unsupported_on_gpu(cfg)
}

/// Why NCCL ranks need MPI.
const NO_CONTROL_COMMUNICATOR: &str = "--backend nccl needs the `mpi` feature and mpirun: \
     the engine's control traffic (schedule agreement, overflow flags, norms) runs on a host \
     communicator, and a torchrun-style launch (RANK, WORLD_SIZE, MASTER_ADDR) gives it none; \
     build with `--features cuda,mpi` and launch with `mpirun -np <GPUs> zero-train --backend \
     nccl --device cuda ...`";

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

/// This process's NCCL rank under `mpirun`: rank 0's unique id broadcast over MPI, the GPU of
/// the process's local rank. Collective over MPI's world.
///
/// # Errors
/// A torchrun-style launch that MPI does not see (a `WORLD_SIZE` other than MPI's), a local
/// rank past the machine's GPUs, a missing CUDA driver, GPU or NCCL (named), MPI failures.
#[cfg(all(feature = "cuda", feature = "mpi"))]
pub(crate) fn nccl_rank(
    mpi: &zero_comm::mpi::Mpi,
    config: zero_comm::Config,
) -> Result<RankDevice, TrainError> {
    let torchrun_size = std::env::var("WORLD_SIZE").ok();
    if torchrun_size
        .as_deref()
        .is_some_and(|n| n != mpi.size().to_string())
    {
        return Err(TrainError::Unsupported(format!(
            "WORLD_SIZE={} but MPI sees {} process(es): {NO_CONTROL_COMMUNICATOR}",
            torchrun_size.unwrap_or_default(),
            mpi.size()
        )));
    }
    let ordinal = local_rank(mpi)?;
    zero_comm::nccl::available()?;
    let mut id: zero_comm::nccl::UniqueId = if mpi.rank() == 0 {
        zero_comm::nccl::new_id()?
    } else {
        [0; 128]
    };
    mpi.broadcast_id(&mut id, 0, config.timeout)?;
    let rank = cuda::CudaRank::nccl(ordinal, id, mpi.rank(), mpi.size(), config)?;
    Ok(RankDevice::Cuda(Box::new(rank)))
}

/// The process's rank on its machine, which picks its GPU: Open MPI's
/// `OMPI_COMM_WORLD_LOCAL_RANK`, else MPI's shared-memory split of the world.
#[cfg(all(feature = "cuda", feature = "mpi"))]
fn local_rank(mpi: &zero_comm::mpi::Mpi) -> Result<usize, TrainError> {
    let from_env = std::env::var("OMPI_COMM_WORLD_LOCAL_RANK").ok();
    match from_env.map(|v| v.trim().parse::<usize>().map_err(|_| v)) {
        Some(Ok(local)) => Ok(local),
        Some(Err(v)) => Err(TrainError::Unsupported(format!(
            "OMPI_COMM_WORLD_LOCAL_RANK={v:?} is not a rank"
        ))),
        None => Ok(mpi.local_rank()?.0),
    }
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
    use zero_gpt::cuda::CudaBackend;

    /// The GPU every rank of a device-local process shares.
    const SHARED_ORDINAL: usize = 0;

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
        #[cfg(feature = "mpi")]
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
        #[cfg(feature = "mpi")]
        pub(crate) fn nccl(
            ordinal: usize,
            id: zero_comm::nccl::UniqueId,
            rank: usize,
            size: usize,
            config: zero_comm::Config,
        ) -> Result<Self, TrainError> {
            Ok(Self {
                backend: CudaBackend::on_default_stream(ordinal)?,
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
                #[cfg(feature = "mpi")]
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
            };
            Ok((self.backend, ops))
        }
    }

    /// `n` ranks on GPU 0, each to be moved into its own thread: the model's backend, the
    /// engine's kernels and a device-local peer.
    ///
    /// # Errors
    /// A missing CUDA library or GPU (named), kernel compilation or stream creation errors.
    pub fn ranks(n: usize, config: zero_comm::Config) -> Result<Vec<CudaRank>, TrainError> {
        let backends = (0..n)
            .map(|_| CudaBackend::on_default_stream(SHARED_ORDINAL))
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
                Ok(CudaRank {
                    backend,
                    kernels: CudaKernels::new(SHARED_ORDINAL)?,
                    ordinal: SHARED_ORDINAL,
                    peers: Peers::DeviceLocal(comm),
                })
            })
            .collect()
    }
}
