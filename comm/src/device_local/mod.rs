//! The local backend over device buffers: N ranks as threads of one process sharing one GPU,
//! each issuing work on its own stream, each collective reading the peers' device buffers
//! directly (one process, one context: a device address is valid in every thread). NCCL
//! refuses two ranks on one device; this is how one GPU runs N_d = 2, 4, 8.
//!
//! Reductions combine the ranks' inputs in rank order 0..N-1 in f32 and round once, element
//! by element, so results are bitwise those of the host [`crate::local`] backend, and
//! all-reduce is literally reduce-scatter's phase followed by all-gather's. Its kernel
//! reduces the f32 family only: reductions of i32, i64 and f64 are refused in step 1
//! ([`CommError::Unsupported`]); all-gather and broadcast move every type.
//!
//! The protocol is written once over [`DeviceOps`]: [`HostOps`] runs it on host memory (the
//! CPU tests), `CudaOps` (feature `cuda`) on a CUDA stream with an NVRTC-compiled kernel.
//!
//! Protocol for the collective with sequence number s on rank r:
//! 1. check the buffers' lengths against the call (NCCL's layouts) and describe the call;
//! 2. record event `ready` on r's stream after all work issued before the call;
//! 3. entry exchange: publish (description, send address, recv address, `ready`); wait for
//!    every rank, at most the group's timeout;
//! 4. compare descriptions; on a mismatch every rank sees the same table, so every rank
//!    takes one committed exchange, breaks the group and returns the error;
//! 5. make r's stream wait on every peer's `ready`;
//! 6. per phase: enqueue the phase's copies and reductions on r's stream, writing only r's
//!    own recv buffer; record event `done` (if recording fails, synchronise the stream and
//!    publish no event); committed exchange of `done`; make r's stream wait on every
//!    peer's `done`. All-reduce has two phases (reduce chunk r; copy the peers' chunks),
//!    the other collectives one.
//!
//! Soundness, which every `// SAFETY:` comment of this module cites:
//! - S1 (visibility): peers read r's buffers only in work enqueued after step 5, which runs
//!   after r's `ready`: everything r's stream wrote before the call is visible.
//! - S2 (disjoint phases): within a phase each rank writes only its own recv buffer, and
//!   only ranges no rank reads in that phase: reduce chunk j of every input into rank j's
//!   chunk j; gather chunks from peers' buffers finished in an earlier phase; an in-place
//!   copy whose source is its destination is skipped.
//! - S3 (bounds): every address is a published buffer start plus an offset that step 1's
//!   length checks keep inside that buffer, and step 4 proves every rank agreed on the
//!   element count, type, root and reduction.
//! - S4 (lifetime): after the final committed exchange r's stream waits on every peer's
//!   `done`, which marks the end of the peers' reads of r's buffers; so any later work on r's
//!   stream (a write, or a stream-ordered free) follows those reads. The CUDA ranks' context
//!   has cudarc's event tracking off (`zero_alloc::context`, checked by `cuda::create`), so
//!   the typed front-end's pointer guards record nothing: another stream that later uses a
//!   buffer orders itself after r's stream (an event or a host synchronisation, that
//!   module's O2). Committed exchanges never time out: they
//!   follow only enqueues, which do not block; they fail only when a rank is gone, i.e. its
//!   communicator was dropped (outside a call, or while panicking, which is a bug).

mod checks;
mod ops;
mod protocol;
mod rendezvous;

#[cfg(feature = "cuda")]
pub mod cuda;

use std::sync::Arc;

pub use ops::{DeviceOps, HostOps};

use crate::communicator::Collective;
use crate::config::Config;
use crate::dtype::DType;
use crate::element::Element;
use crate::error::{BreakCause, CommError, Result};
use rendezvous::Rendezvous;

/// A buffer by address: `len` elements from `addr` (a device address for `CudaOps`, a host
/// address for [`HostOps`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawBuf {
    /// The first byte.
    pub addr: u64,
    /// Elements.
    pub len: usize,
}

/// One rank of a device-local group; move it into the rank's thread.
#[derive(Debug)]
pub struct DeviceLocalComm<O: DeviceOps> {
    rank: usize,
    size: usize,
    seq: u64,
    ops: O,
    shared: Arc<Rendezvous<O::Event>>,
}

/// Creates a group of `n` ranks over host memory; element r is rank r's communicator.
///
/// # Errors
/// [`CommError::InvalidArgument`] when `n` is 0.
pub fn create(n: usize, config: Config) -> Result<Vec<DeviceLocalComm<HostOps>>> {
    create_with_ops(vec![HostOps; n], config)
}

/// Creates a group with one rank per element of `ops` (rank r issues its work through
/// `ops[r]`).
///
/// # Errors
/// [`CommError::InvalidArgument`] when `ops` is empty.
pub fn create_with_ops<O: DeviceOps>(
    ops: Vec<O>,
    config: Config,
) -> Result<Vec<DeviceLocalComm<O>>> {
    let size = ops.len();
    if size == 0 {
        return Err(CommError::InvalidArgument {
            what: "a group needs at least one rank".into(),
        });
    }
    let shared = Arc::new(Rendezvous::new(size, config.timeout));
    Ok(ops
        .into_iter()
        .enumerate()
        .map(|(rank, ops)| DeviceLocalComm {
            rank,
            size,
            seq: 0,
            ops,
            shared: Arc::clone(&shared),
        })
        .collect())
}

impl<O: DeviceOps> DeviceLocalComm<O> {
    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Ranks in the group.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The rank's device operations (its stream).
    pub fn ops(&self) -> &O {
        &self.ops
    }

    /// Returns once every rank has called `barrier`; every rank's later stream work is
    /// ordered after every rank's earlier stream work.
    ///
    /// # Errors
    /// `Timeout` or `Broken` as a collective.
    pub fn barrier(&mut self) -> Result<()> {
        self.seq += 1;
        protocol::barrier(self)
    }

    /// Runs `call` with NCCL's layouts: `send = None` is the in-place form (in-place
    /// reduce-scatter leaves rank r's result at chunk r of `recv`; in-place all-gather reads
    /// rank r's input from chunk r; in-place broadcast reads the root's `recv`).
    ///
    /// # Safety
    /// `send` readable and `recv` writable for their lengths in `dtype` elements, by work on
    /// this rank's stream issued from now until the work this rank issues after the call;
    /// `send` and `recv` disjoint; nothing else writes them meanwhile (S3, S4).
    ///
    /// # Errors
    /// `Length`, `Root` or `InvalidArgument` when the buffers do not fit the call;
    /// `Unsupported` for reduce; `Mismatch` when ranks disagree on the call; `Timeout` or
    /// `Broken` when a peer does not arrive or is gone; a device error from the ops.
    pub unsafe fn run_raw(
        &mut self,
        call: Collective,
        dtype: DType,
        send: Option<RawBuf>,
        recv: RawBuf,
    ) -> Result<()> {
        let desc = checks::describe(call, dtype, self.seq, self.size, send, recv)?;
        self.seq += 1;
        // SAFETY: forwarded from this function's contract.
        unsafe { protocol::run(self, desc, send, recv) }
    }
}

impl DeviceLocalComm<HostOps> {
    /// [`DeviceLocalComm::run_raw`] over host slices (the CPU model of the device flavour).
    ///
    /// # Errors
    /// As [`DeviceLocalComm::run_raw`].
    pub fn run<T: Element>(
        &mut self,
        call: Collective,
        send: Option<&[T]>,
        recv: &mut [T],
    ) -> Result<()> {
        let raw = |p: *const T, len| RawBuf {
            addr: p.expose_provenance() as u64,
            len,
        };
        let send = send.map(|s| raw(s.as_ptr(), s.len()));
        let recv = raw(recv.as_mut_ptr().cast_const(), recv.len());
        // SAFETY: the slices are live and borrowed (so disjoint and unwritten by others) for
        // the whole call, and HostOps completes every operation before the call returns.
        unsafe { self.run_raw(call, T::DTYPE, send, recv) }
    }
}

impl<O: DeviceOps> Drop for DeviceLocalComm<O> {
    fn drop(&mut self) {
        let rank = self.rank;
        let cause = if std::thread::panicking() {
            BreakCause::Panicked { rank }
        } else {
            BreakCause::Left { rank }
        };
        self.shared.leave(rank, cause);
    }
}
