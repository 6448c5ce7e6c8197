//! The local backend: N ranks as threads of one process over shared memory.
//!
//! Each collective publishes the rank's buffer addresses in a slot table; after an entry wait
//! every rank reads its peers' buffers directly (no serialisation, no staging copies) and
//! synchronises phases with a generation barrier (the protocol is described in `group.rs`).

mod algorithms;
mod barrier;
mod group;
mod split;

use std::sync::Arc;

pub use algorithms_public::memory_traffic;

use crate::backend::{Backend, Leave};
use crate::communicator::Communicator;
use crate::config::Config;
use crate::dtype::{BufMut, BufRef};
use crate::error::{CommError, Result};
use crate::op::OpDesc;
use crate::reduce_op::ReduceOp;

use group::{Addr, Group, Io, Member};

/// Creates a group of `n` ranks with the default [`Config`]; element r is rank r's
/// communicator, to be moved into its thread.
///
/// # Errors
/// [`CommError::InvalidArgument`] when `n` is 0.
///
/// # Examples
/// ```
/// let comms = zero_comm::local::create(2)?;
/// std::thread::scope(|s| {
///     for comm in comms {
///         s.spawn(move || {
///             let mut x = vec![comm.rank() as f32 + 1.0; 4];
///             comm.all_reduce_in_place(&mut x, zero_comm::ReduceOp::Sum).unwrap();
///             assert_eq!(x, vec![3.0; 4]);
///         });
///     }
/// });
/// # Ok::<(), zero_comm::CommError>(())
/// ```
pub fn create(n: usize) -> Result<Vec<Communicator>> {
    create_with(n, Config::default())
}

/// As [`create`], with settings.
///
/// # Errors
/// [`CommError::InvalidArgument`] when `n` is 0.
pub fn create_with(n: usize, config: Config) -> Result<Vec<Communicator>> {
    if n == 0 {
        return Err(CommError::InvalidArgument {
            what: "a group needs at least one rank".into(),
        });
    }
    let group = Arc::new(Group::new(n, config));
    Ok((0..n)
        .map(|rank| {
            let member = Arc::new(Member {
                rank,
                group: Arc::clone(&group),
            });
            Communicator::new(Box::new(LocalComm { member }), config)
        })
        .collect())
}

/// One rank of a local group.
#[derive(Debug)]
pub struct LocalComm {
    member: Arc<Member>,
}

fn send_addr(send: &Option<BufRef<'_>>) -> Addr {
    Addr(send.as_ref().map_or(0, |b| b.as_ptr().expose_provenance()))
}

/// Addresses for a call; `send = None` means in place, `own_chunk` is where an in-place
/// input starts inside `recv` (all-gather's chunk r).
fn io(send: &Option<BufRef<'_>>, recv: &mut BufMut<'_>, own_chunk: usize) -> Io {
    let recv_addr = recv.as_mut_ptr().expose_provenance();
    match send {
        Some(_) => Io {
            send: send_addr(send),
            recv: Addr(recv_addr),
            in_place: false,
        },
        None => {
            let offset = own_chunk * recv.dtype().size();
            Io {
                send: Addr(recv_addr + offset),
                recv: Addr(recv_addr),
                in_place: true,
            }
        }
    }
}

impl Backend for LocalComm {
    fn name(&self) -> &'static str {
        "local"
    }
    fn rank(&self) -> usize {
        self.member.rank
    }
    fn size(&self) -> usize {
        self.member.group.size
    }

    fn all_reduce(
        &mut self,
        desc: &OpDesc,
        send: Option<BufRef<'_>>,
        mut recv: BufMut<'_>,
        op: ReduceOp,
    ) -> Result<()> {
        let e = self.member.enter(desc, io(&send, &mut recv, 0))?;
        algorithms::all_reduce(&self.member, desc, &e, op)
    }

    fn reduce_scatter(
        &mut self,
        desc: &OpDesc,
        send: Option<BufRef<'_>>,
        mut recv: BufMut<'_>,
        op: ReduceOp,
    ) -> Result<()> {
        let e = self.member.enter(desc, io(&send, &mut recv, 0))?;
        algorithms::reduce_scatter(&self.member, desc, &e, op)
    }

    fn all_gather(
        &mut self,
        desc: &OpDesc,
        send: Option<BufRef<'_>>,
        mut recv: BufMut<'_>,
    ) -> Result<()> {
        let own = self.member.rank * (desc.count / self.size());
        let e = self.member.enter(desc, io(&send, &mut recv, own))?;
        algorithms::all_gather(&self.member, desc, &e)
    }

    fn broadcast(
        &mut self,
        desc: &OpDesc,
        send: Option<BufRef<'_>>,
        mut recv: BufMut<'_>,
        root: usize,
    ) -> Result<()> {
        let e = self.member.enter(desc, io(&send, &mut recv, 0))?;
        algorithms::broadcast(&self.member, desc, &e, root)
    }

    fn reduce(
        &mut self,
        desc: &OpDesc,
        send: Option<BufRef<'_>>,
        mut recv: BufMut<'_>,
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        let e = self.member.enter(desc, io(&send, &mut recv, 0))?;
        algorithms::reduce(&self.member, desc, &e, op, root)
    }

    fn barrier(&mut self, desc: &OpDesc) -> Result<()> {
        self.member.wait_entry(desc)
    }

    fn split(&mut self, desc: &OpDesc, color: u32, key: u32) -> Result<Box<dyn Backend>> {
        let (rank, group) = split::split(&self.member, desc, color, key)?;
        Ok(Box::new(LocalComm {
            member: Arc::new(Member { rank, group }),
        }))
    }

    fn leave_handle(&self) -> Arc<dyn Leave> {
        Arc::clone(&self.member) as Arc<dyn Leave>
    }
}

mod algorithms_public {
    use crate::op::OpKind;

    /// Bytes the local algorithm reads and writes in memory, summed over all `ranks`, for one
    /// call on an array of `bytes` (the whole array, as nccl-tests' `size`). This is what
    /// "achieved memory bandwidth" divides by time; a memcpy of S bytes counts 2S.
    pub fn memory_traffic(kind: OpKind, bytes: u64, ranks: usize, in_place: bool) -> u64 {
        let (s, n) = (bytes, ranks.max(1) as u64);
        let share = s / n * (n - 1);
        match kind {
            // Phase 1 per rank: read N chunks, write 1; phase 2: read and write N-1 chunks.
            OpKind::AllReduce => n * (s + s / n) + n * 2 * share,
            // Per rank: read the N inputs of its chunk, write the chunk.
            OpKind::ReduceScatter | OpKind::Reduce => n * s + s,
            // Per rank: read and write N chunks (N-1 in place).
            OpKind::AllGather => 2 * n * if in_place { share } else { s },
            // Every rank copies the root's array (the in-place root does not).
            OpKind::Broadcast => 2 * s * if in_place { n - 1 } else { n },
            OpKind::Barrier | OpKind::Split => 0,
        }
    }
}
