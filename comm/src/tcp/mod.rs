//! The TCP backend: one process (or thread) per rank over `std::net` sockets, host buffers,
//! no MPI; launched by torchrun or anything that sets `RANK`, `WORLD_SIZE`, `MASTER_ADDR`
//! and `MASTER_PORT` ([`from_env`]), or wired by hand ([`Listener::accept_group`] on rank 0,
//! [`join`] on the others).
//!
//! It is a star: rank 0 receives every rank's input, computes the result with the crate's
//! rank-order kernel ([`reduce_slices`](crate::reduce_slices)) exactly as the local backend
//! does, and sends each rank its part, so results are bitwise the local backend's for every
//! dtype, reduction and layout. It is meant for control traffic and small CPU jobs, not
//! bandwidth. Bytes through rank 0's sockets per collective on an array of S bytes and N
//! ranks, received + sent (plus a 36-byte header each way per rank):
//! - all-reduce: (N-1)S + (N-1)S;
//! - reduce-scatter: (N-1)S + (N-1)S/N; all-gather: (N-1)S/N + (N-1)S;
//! - broadcast: S (0 when rank 0 is the root) + (N-1)S;
//! - reduce: (N-1)S + S (0 when rank 0 is the root); barrier: headers only.
//!
//! # Wire protocol (all integers little-endian)
//! 1. Forming a group (`connect.rs`): rank r > 0 connects to rank 0 and sends a hello
//!    (`b"ZTCH"`, version u16, r u32, size u32); when all N-1 are in, rank 0 answers each
//!    with a welcome (`b"ZTCW"`, version u16, size u32).
//! 2. Every collective is one frame per rank to rank 0, then one frame back. A frame is a
//!    36-byte header (`b"ZTCF"`, seq u64, op u8, status u8, dtype u8, redop u8, root u32,
//!    count u64, payload length u64) and the payload (`wire.rs`).
//! 3. Rank 0 reads every rank's frame in rank order and checks the sequence number, the
//!    descriptor (op, dtype, count, root, redop: a difference fails every rank with
//!    [`CommError::Mismatch`](crate::CommError::Mismatch)) and the exact payload length the
//!    call implies, before reading any payload byte; nothing is allocated from a peer's word.
//!    The check is made whatever `Config::debug_checks` says: the header travels anyway.
//! 4. Rank 0 answers each rank with status 0 and the rank's part of the result, or status 1
//!    and a notice (`notice.rs`) naming the cause: a rank that closed its connection
//!    (`Left`), timed out, or sent a malformed frame (`Failed`), or a peer whose call differs.
//! 5. Every read and write runs under the group's `Config::timeout` from the start of the
//!    collective; after a failure a rank closes its sending side, so peers that are still
//!    waiting read end-of-stream at once instead of waiting out the timeout.
//!
//! `split` opens new connections per colour (see `split.rs`). Leaving (dropping a
//! communicator, even while a collective of it runs on the progress thread) closes the
//! rank's sending sides; peers report it as [`BreakCause::Left`](crate::BreakCause::Left),
//! which is also what a process that died looks like.
//!
//! # Examples
//! ```
//! use zero_comm::{tcp, Config, ReduceOp};
//!
//! let listener = tcp::Listener::bind("127.0.0.1:0")?;
//! let addr = listener.local_addr()?.to_string();
//! let peer = std::thread::spawn(move || -> zero_comm::Result<Vec<f32>> {
//!     let comm = tcp::join(&addr, 1, 2, Config::default())?;
//!     let mut x = vec![2.0f32; 3];
//!     comm.all_reduce_in_place(&mut x, ReduceOp::Sum)?;
//!     Ok(x)
//! });
//! let comm = listener.accept_group(2, Config::default())?;
//! let mut x = vec![1.0f32; 3];
//! comm.all_reduce_in_place(&mut x, ReduceOp::Sum)?;
//! assert_eq!(x, vec![3.0; 3]);
//! assert_eq!(peer.join().unwrap()?, vec![3.0; 3]);
//! # Ok::<(), zero_comm::CommError>(())
//! ```

mod connect;
mod notice;
mod ops;
mod split;
mod star;
mod wire;

use std::net::{Shutdown, TcpStream};
use std::sync::Arc;

pub use connect::{join, Listener};

use crate::backend::{Backend, Leave};
use crate::bootstrap::LaunchEnv;
use crate::communicator::Communicator;
use crate::config::Config;
use crate::dtype::{BufMut, BufRef};
use crate::error::{CommError, Result};
use crate::op::OpDesc;
use crate::reduce_op::ReduceOp;

use ops::{Call, Stage};
use star::Net;

/// Forms the group that torchrun's variables describe: rank 0 binds
/// `MASTER_ADDR:MASTER_PORT` and accepts, the others join it.
///
/// # Errors
/// [`CommError::Launch`] for a missing or malformed variable; as [`from_launch`] otherwise.
pub fn from_env(config: Config) -> Result<Communicator> {
    from_launch(&LaunchEnv::from_env()?, config)
}

/// As [`from_env`], from variables read elsewhere.
///
/// # Errors
/// As [`Listener::accept_group`] and [`join`].
pub fn from_launch(env: &LaunchEnv, config: Config) -> Result<Communicator> {
    let master = env.master();
    if env.rank == 0 {
        Listener::bind(&master)?.accept_group(env.world_size, config)
    } else {
        join(&master, env.rank, env.world_size, config)
    }
}

/// Closes a rank's sending sides when it leaves, so peers stop waiting for it.
#[derive(Debug)]
struct Closer {
    links: Vec<TcpStream>,
}

impl Leave for Closer {
    fn leave(&self, _panicked: bool) {
        for link in &self.links {
            // A link that is already closed has nothing left to close.
            let _ = link.shutdown(Shutdown::Write);
        }
    }
}

/// One rank of a TCP group.
#[derive(Debug)]
pub(crate) struct TcpComm {
    net: Net,
    stage: Stage,
    closer: Arc<Closer>,
}

impl TcpComm {
    /// Wraps a formed group's links (rank 0: ranks 1..size in order; others: rank 0).
    pub(crate) fn new(
        rank: usize,
        size: usize,
        config: Config,
        links: Vec<TcpStream>,
    ) -> Result<TcpComm> {
        if cfg!(target_endian = "big") {
            return Err(CommError::Unsupported {
                backend: "tcp",
                what: "big-endian hosts (payloads travel in native little-endian order)".into(),
            });
        }
        let setup = |what: &str, e: std::io::Error| CommError::Rendezvous {
            addr: "tcp link".into(),
            what: format!("{what}: {e}"),
        };
        let mut clones = Vec::with_capacity(links.len());
        for link in &links {
            // Frames are small and answered at once: send them without Nagle's delay.
            link.set_nodelay(true)
                .map_err(|e| setup("TCP_NODELAY", e))?;
            clones.push(link.try_clone().map_err(|e| setup("cloning a socket", e))?);
        }
        Ok(TcpComm {
            net: Net::new(rank, size, config, links),
            stage: Stage::default(),
            closer: Arc::new(Closer { links: clones }),
        })
    }

    fn run(
        &mut self,
        desc: &OpDesc,
        send: Option<BufRef<'_>>,
        recv: BufMut<'_>,
        op: Option<ReduceOp>,
    ) -> Result<()> {
        let call = Call { desc, send, recv };
        if self.net.rank == 0 {
            ops::hub(&mut self.net, &mut self.stage, call, op)
        } else {
            ops::leaf(&mut self.net, call)
        }
    }
}

impl Backend for TcpComm {
    fn name(&self) -> &'static str {
        "tcp"
    }
    fn rank(&self) -> usize {
        self.net.rank
    }
    fn size(&self) -> usize {
        self.net.size
    }
    fn all_reduce(
        &mut self,
        desc: &OpDesc,
        send: Option<BufRef<'_>>,
        recv: BufMut<'_>,
        op: ReduceOp,
    ) -> Result<()> {
        self.run(desc, send, recv, Some(op))
    }
    fn reduce_scatter(
        &mut self,
        desc: &OpDesc,
        send: Option<BufRef<'_>>,
        recv: BufMut<'_>,
        op: ReduceOp,
    ) -> Result<()> {
        self.run(desc, send, recv, Some(op))
    }
    fn all_gather(
        &mut self,
        desc: &OpDesc,
        send: Option<BufRef<'_>>,
        recv: BufMut<'_>,
    ) -> Result<()> {
        self.run(desc, send, recv, None)
    }
    fn broadcast(
        &mut self,
        desc: &OpDesc,
        send: Option<BufRef<'_>>,
        recv: BufMut<'_>,
        _root: usize,
    ) -> Result<()> {
        self.run(desc, send, recv, None)
    }
    fn reduce(
        &mut self,
        desc: &OpDesc,
        send: Option<BufRef<'_>>,
        recv: BufMut<'_>,
        op: ReduceOp,
        _root: usize,
    ) -> Result<()> {
        self.run(desc, send, recv, Some(op))
    }
    fn barrier(&mut self, desc: &OpDesc) -> Result<()> {
        self.run(desc, None, BufMut::F32(&mut []), None)
    }
    fn split(&mut self, desc: &OpDesc, color: u32, key: u32) -> Result<Box<dyn Backend>> {
        Ok(Box::new(split::split(self, desc, color, key)?))
    }
    fn leave_handle(&self) -> Arc<dyn Leave> {
        Arc::clone(&self.closer) as Arc<dyn Leave>
    }
    /// Rank 0 stages every rank's input and, for some calls, the reduced array, in heap
    /// buffers kept at their high-water mark; other ranks stage nothing.
    fn staging_outside_bytes(&self) -> u64 {
        self.stage.bytes()
    }
}
