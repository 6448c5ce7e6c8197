//! How a process that is one rank of a multi-process job finds its peers: the launcher that
//! started it, and the host communicator that joins the processes (the `mpi`, `tcp` and
//! `nccl` backends; the local backend starts its ranks itself).
//!
//! Two launchers, told apart by the environment:
//! - torchrun, or anything that sets its variables (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
//!   `MASTER_ADDR`, `MASTER_PORT`): zero-comm's TCP backend, rank 0 listening on
//!   `MASTER_ADDR:MASTER_PORT`. Chosen whenever `WORLD_SIZE` or `MASTER_ADDR` is set.
//! - `mpirun` (feature `mpi`): MPI's world. Open MPI and MPICH set neither variable.
//!
//! Under NCCL the host communicator carries the engine's control traffic (schedule agreement,
//! the overflow flag, norm partials) and rank 0's NCCL unique id; the model states move on
//! NCCL ([`crate::run::device`]).

use crate::cli::config::Backend;
use crate::error::TrainError;
use zero_comm::bootstrap::LaunchEnv;
use zero_comm::Communicator;

/// This process's rank in a job, joined to its peers.
#[derive(Debug)]
pub(crate) struct Joined {
    /// The host communicator over every process of the job.
    pub(crate) control: Communicator,
    /// The process's index on its machine (which GPU it drives under NCCL).
    #[cfg_attr(
        not(feature = "cuda"),
        allow(dead_code, reason = "only NCCL ranks pick a GPU by it")
    )]
    pub(crate) local_rank: usize,
    /// Keeps MPI initialised while `control` lives.
    #[cfg(feature = "mpi")]
    pub(crate) mpi: Option<zero_comm::mpi::Mpi>,
}

/// True when the environment describes a torchrun-style launch.
fn torchrun_style() -> bool {
    ["WORLD_SIZE", "MASTER_ADDR"]
        .iter()
        .any(|var| std::env::var_os(var).is_some())
}

/// Joins the job as `backend` needs: TCP under a torchrun-style launch (`tcp`, `nccl`), MPI
/// under `mpirun` (`mpi`, `nccl`).
///
/// # Errors
/// A launch variable that is missing or malformed (named); a peer that does not arrive within
/// the communicator's timeout; a build without the `mpi` feature where MPI is needed.
pub(crate) fn join(backend: Backend, config: zero_comm::Config) -> Result<Joined, TrainError> {
    match backend {
        Backend::Tcp => join_tcp(config),
        Backend::Mpi => join_mpi(config),
        Backend::Nccl if torchrun_style() => join_tcp(config),
        Backend::Nccl => join_mpi(config).map_err(|e| match e {
            TrainError::Unsupported(_) => TrainError::Unsupported(NO_LAUNCHER.into()),
            other => other,
        }),
        Backend::Local => Err(TrainError::Unsupported(
            "the local backend starts its ranks as threads; it joins no launcher".into(),
        )),
    }
}

/// Why `--backend nccl` could not start without a launcher.
const NO_LAUNCHER: &str = "--backend nccl runs one process per GPU and needs a launcher: \
     torchrun (or its variables: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT; for one \
     GPU: RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500), or mpirun \
     with a build with `--features cuda,mpi`";

/// Rank `RANK` of `WORLD_SIZE` over TCP.
fn join_tcp(config: zero_comm::Config) -> Result<Joined, TrainError> {
    let env = LaunchEnv::from_env().map_err(|e| {
        TrainError::Unsupported(format!(
            "{e}: this backend runs one process per rank, started by torchrun or with its \
             variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT; docs/trainer.md)"
        ))
    })?;
    // Before joining: a world past zero-train's limit would otherwise wait out the whole
    // timeout for ranks that the run would refuse anyway.
    if env.world_size > zero::MAX_RANKS {
        return Err(TrainError::Unsupported(format!(
            "WORLD_SIZE {} is past the {} ranks one zero-train run takes",
            env.world_size,
            zero::MAX_RANKS
        )));
    }
    Ok(Joined {
        control: zero_comm::tcp::from_launch(&env, config)?,
        local_rank: env.local_rank,
        #[cfg(feature = "mpi")]
        mpi: None,
    })
}

/// This `mpirun` process's rank of MPI's world.
#[cfg(feature = "mpi")]
fn join_mpi(config: zero_comm::Config) -> Result<Joined, TrainError> {
    let mpi = zero_comm::mpi::Mpi::init()?;
    let local_rank = mpi_local_rank(&mpi)?;
    Ok(Joined {
        control: mpi.world(config)?,
        local_rank,
        mpi: Some(mpi),
    })
}

/// Refuses MPI in a build without it.
#[cfg(not(feature = "mpi"))]
fn join_mpi(_config: zero_comm::Config) -> Result<Joined, TrainError> {
    Err(TrainError::Unsupported(
        "--backend mpi needs a build with `--features mpi` (and mpirun to launch it)".into(),
    ))
}

/// The process's rank on its machine: Open MPI's `OMPI_COMM_WORLD_LOCAL_RANK`, else MPI's
/// shared-memory split of the world.
#[cfg(feature = "mpi")]
fn mpi_local_rank(mpi: &zero_comm::mpi::Mpi) -> Result<usize, TrainError> {
    let from_env = std::env::var("OMPI_COMM_WORLD_LOCAL_RANK").ok();
    match from_env.map(|v| v.trim().parse::<usize>().map_err(|_| v)) {
        Some(Ok(local)) => Ok(local),
        Some(Err(v)) => Err(TrainError::Unsupported(format!(
            "OMPI_COMM_WORLD_LOCAL_RANK={v:?} is not a rank"
        ))),
        None => Ok(mpi.local_rank()?.0),
    }
}
