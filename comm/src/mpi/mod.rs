//! The MPI backend (feature `mpi`): one process per rank, launched by `mpirun`, over the
//! system's MPI library (OpenMPI 4.1 is what CI runs) through rsmpi's bindings.
//!
//! Rank and world size come from MPI. Results are bitwise equal to the [`local`](crate::local)
//! backend's (same chunking, same rank-order f32 reduction kernel); see `backend.rs` for how.
//! Every collective waits at most the group's [`Config::timeout`], with MPI's error handler
//! set to return codes, so a peer that died or never arrives becomes an error naming the
//! collective rather than a hang.
//!
//! # Examples
//! ```no_run
//! # fn main() -> zero_comm::Result<()> {
//! use zero_comm::{mpi::Mpi, Config, ReduceOp};
//!
//! // Run under `mpirun -np 4 ./program`.
//! let mpi = Mpi::init()?;
//! let comm = mpi.world(Config::default())?;
//! let mut grads = vec![comm.rank() as f32; 8];
//! comm.all_reduce_in_place(&mut grads, ReduceOp::Sum)?;
//! # Ok(())
//! # }
//! ```

mod backend;
mod check;
mod env;
mod raw;
mod stage;

use std::cell::Cell;
use std::sync::Arc;
use std::time::Duration;

use mpi::ffi;

use crate::communicator::Communicator;
use crate::config::Config;
use crate::error::{BreakCause, CommError, Result};
use crate::op::OpKind;

use self::env::Env;
use self::raw::{bytes_type, int, CommHandle};

/// How all-reduce reduces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Algorithm {
    /// Alltoall of chunks, reduction in rank order with the crate's kernel, all-gather:
    /// bitwise equal to the local backend for every dtype. The default.
    #[default]
    Deterministic,
    /// `MPI_Iallreduce` for f32 all-reduce (other dtypes and collectives stay
    /// deterministic). MPI picks the reduction order, so results may differ from the local
    /// backend's in the last bits; offered to measure what determinism costs.
    Native,
}

/// This process's handle on MPI: initialises the library (`MPI_THREAD_MULTIPLE`), makes
/// communicators over `MPI_COMM_WORLD`, and bootstraps other backends.
///
/// MPI is finalised when this value and every communicator made from it are dropped; it
/// cannot be initialised again in the same process, so keep it for the program's lifetime.
#[derive(Debug)]
pub struct Mpi {
    /// A private duplicate of the world for bootstrap traffic (`broadcast_id`).
    boot: CommHandle,
    /// False after a bootstrap call timed out (its request may be pending: leak `boot`).
    boot_usable: Cell<bool>,
    rank: usize,
    size: usize,
    env: Arc<Env>,
}

fn mpi_error(e: &raw::MpiFailure) -> CommError {
    CommError::Unsupported {
        backend: "mpi",
        what: e.to_string(),
    }
}

impl Mpi {
    /// Initialises MPI (or joins an initialisation done elsewhere in the process).
    ///
    /// A program started without `mpirun` runs as rank 0 of 1.
    ///
    /// # Errors
    /// [`CommError::Unsupported`] when MPI cannot be initialised, was finalised already, or
    /// lacks `MPI_THREAD_MULTIPLE`.
    pub fn init() -> Result<Mpi> {
        let env = Env::init()?;
        // SAFETY: predefined constant handle; MPI is initialised.
        let world = CommHandle(unsafe { ffi::RSMPI_COMM_WORLD });
        let boot = world.dup().map_err(|e| mpi_error(&e))?;
        let (rank, size) = boot.rank_size().map_err(|e| mpi_error(&e))?;
        Ok(Mpi {
            boot,
            boot_usable: Cell::new(true),
            rank,
            size,
            env,
        })
    }

    /// This process's rank in `MPI_COMM_WORLD`.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of processes in `MPI_COMM_WORLD`.
    pub fn size(&self) -> usize {
        self.size
    }

    /// A communicator over every process (a duplicate of `MPI_COMM_WORLD`, so its traffic
    /// never mixes with other libraries'), reducing deterministically.
    ///
    /// Collective: every process must call it.
    ///
    /// # Errors
    /// [`CommError::Unsupported`] when MPI fails to duplicate the world.
    pub fn world(&self, config: Config) -> Result<Communicator> {
        self.world_with(config, Algorithm::Deterministic)
    }

    /// As [`Mpi::world`], choosing the all-reduce algorithm.
    ///
    /// # Errors
    /// As [`Mpi::world`].
    pub fn world_with(&self, config: Config, algorithm: Algorithm) -> Result<Communicator> {
        let comm = self.boot.dup().map_err(|e| mpi_error(&e))?;
        let backend = backend::MpiComm::new(comm, config, algorithm, Arc::clone(&self.env))?;
        Ok(Communicator::new(Box::new(backend), config))
    }

    /// This process's rank among the processes on its machine, and their number
    /// (`MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)`): the `LOCAL_RANK` that picks a GPU.
    ///
    /// Collective: every process must call it.
    ///
    /// # Errors
    /// [`CommError::Unsupported`] when MPI fails.
    pub fn local_rank(&self) -> Result<(usize, usize)> {
        let key = int(self.rank).unwrap_or(0);
        // SAFETY: predefined constant handles, the out-handle overwritten by the call.
        let (mut node, split_type, info) = unsafe {
            (
                ffi::RSMPI_COMM_NULL,
                ffi::RSMPI_COMM_TYPE_SHARED,
                ffi::RSMPI_INFO_NULL,
            )
        };
        // SAFETY: `boot` is a valid communicator; `node` is a live local.
        let rc = unsafe { ffi::MPI_Comm_split_type(self.boot.0, split_type, key, info, &mut node) };
        raw::check("MPI_Comm_split_type", rc).map_err(|e| mpi_error(&e))?;
        let node = CommHandle(node);
        let out = node.rank_size().map_err(|e| mpi_error(&e));
        node.free();
        out
    }

    /// Broadcasts an opaque id (NCCL's 128-byte unique id, say) from `root` to every process:
    /// the bootstrap of backends that cannot find their peers themselves.
    ///
    /// Collective: every process must call it with a buffer of the same length.
    ///
    /// # Errors
    /// [`CommError::Timeout`] when a process does not arrive within `timeout`;
    /// [`CommError::Broken`] after such a timeout; [`CommError::Root`] for a root outside the
    /// world; [`CommError::Unsupported`] when MPI fails (e.g. lengths differ).
    pub fn broadcast_id(&self, id: &mut [u8], root: usize, timeout: Duration) -> Result<()> {
        let (op, seq, bytes, rank) = (OpKind::Broadcast, 0, id.len(), self.rank);
        if !self.boot_usable.get() {
            return Err(CommError::Broken {
                op,
                seq,
                bytes,
                rank,
                cause: BreakCause::TimedOut { rank, seq },
                history: Box::default(),
            });
        }
        let (Some(root_i), true) = (int(root), root < self.size) else {
            return Err(CommError::Root {
                op,
                root,
                size: self.size,
            });
        };
        let count = int(bytes).ok_or_else(|| CommError::InvalidArgument {
            what: format!("an id of {bytes} bytes is too long"),
        })?;
        // MPI works on a copy we own, so a timeout can leak it instead of `id`.
        let mut staged = id.to_vec();
        let mut req = raw::null_request();
        // SAFETY: `staged` holds `count` bytes and lives until completion (or is leaked).
        let rc = unsafe {
            ffi::MPI_Ibcast(
                staged.as_mut_ptr().cast(),
                count,
                bytes_type(),
                root_i,
                self.boot.0,
                &mut req,
            )
        };
        raw::check("MPI_Ibcast", rc).map_err(|e| mpi_error(&e))?;
        match raw::wait(req, timeout) {
            Ok(()) => {
                id.copy_from_slice(&staged);
                Ok(())
            }
            Err(raw::WaitError::TimedOut(waited)) => {
                std::mem::forget(staged);
                self.boot_usable.set(false);
                Err(CommError::Timeout {
                    op,
                    seq,
                    bytes,
                    rank,
                    waited,
                    missing: Vec::new(),
                    history: Box::default(),
                })
            }
            Err(raw::WaitError::Failed(e)) => {
                std::mem::forget(staged);
                self.boot_usable.set(false);
                Err(mpi_error(&e))
            }
        }
    }
}

impl Drop for Mpi {
    fn drop(&mut self) {
        if self.boot_usable.get() {
            self.boot.free();
        }
    }
}
