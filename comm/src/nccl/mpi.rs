//! Bootstrapping NCCL over MPI (features `cuda` and `mpi`): rank 0's unique id is broadcast
//! on MPI's world, and each process drives the GPU of its rank on its machine.

use super::comm::{available, new_id, NcclComm, UniqueId};
use crate::config::Config;
use crate::error::Result;
use crate::mpi::Mpi;

impl NcclComm {
    /// One NCCL rank per MPI process, on GPU `local_rank` (its rank among the processes of
    /// its machine). Collective over MPI's world.
    ///
    /// # Errors
    /// As [`NcclComm::from_id`], and the errors of [`Mpi::broadcast_id`] (a process that does
    /// not arrive within `config.timeout`).
    pub fn from_mpi(mpi: &Mpi, config: Config) -> Result<NcclComm> {
        available()?;
        let (local_rank, _) = mpi.local_rank()?;
        let mut id: UniqueId = if mpi.rank() == 0 { new_id()? } else { [0; 128] };
        mpi.broadcast_id(&mut id, 0, config.timeout)?;
        NcclComm::from_id(&id, mpi.rank(), mpi.size(), local_rank, config)
    }
}
