//! One rank of an MPI communicator: the [`Backend`] over MPI's nonblocking collectives.
//!
//! Every reduction is deterministic and bitwise equal to the local backend's: rank r receives
//! chunk r of every peer's input (`MPI_Ialltoall(v)`, bytes only), reduces them in rank order
//! 0..N-1 with the shared f32-accumulating kernel, and all-reduce / reduce then gather the
//! reduced chunks (`MPI_Iallgatherv` / `MPI_Igatherv`). Rejected as the default: MPI's own
//! `MPI_Allreduce`, whose reduction order is unspecified (it changes with the algorithm that
//! OpenMPI's tuned component picks per size) and which has no bf16/f16 datatype;
//! it stays available as [`Algorithm::Native`] for f32.
//!
//! Each call starts a nonblocking collective and polls it until the group's timeout, so a
//! peer that never arrives becomes a [`CommError::Timeout`] naming the collective.

use std::os::raw::{c_int, c_void};
use std::sync::Arc;
use std::time::Duration;

use mpi::ffi;
use zero_alloc::Lent;

use super::check;
use super::env::Env;
use super::raw::{self, bytes_type, check as mpi_check, int, null_request, CommHandle};
use super::stage::{bytes_of, bytes_of_mut, reduce_chunks, Stage};
use super::Algorithm;
use crate::backend::{Backend, Leave};
use crate::chunk::chunk;
use crate::communicator_staging::{StagingLayout, StagingRule};
use crate::config::Config;
use crate::dtype::{BufMut, BufRef, DType};
use crate::error::{BreakCause, CommError, Result};
use crate::op::OpDesc;
use crate::reduce_op::ReduceOp;

/// Why this rank's communicator can no longer be used.
#[derive(Debug, Clone)]
enum Poison {
    Cause(BreakCause),
    Mpi(String),
}

/// One rank of an MPI group.
#[derive(Debug)]
pub(crate) struct MpiComm {
    comm: CommHandle,
    rank: usize,
    size: usize,
    config: Config,
    algorithm: Algorithm,
    stage: Stage,
    poison: Option<Poison>,
    // Last field: dropped after `comm` is freed, so MPI is still initialised then.
    env: Arc<Env>,
}

/// MPI has no way to tell peers that a rank left; they see a timeout instead.
#[derive(Debug)]
struct NoLeave;

impl Leave for NoLeave {
    fn leave(&self, _panicked: bool) {}
}

fn too_big(desc: &OpDesc) -> CommError {
    CommError::Unsupported {
        backend: "mpi",
        what: format!(
            "{} of {} bytes: a message past 2 GiB (MPI counts are C ints)",
            desc.kind,
            desc.bytes()
        ),
    }
}

impl MpiComm {
    /// Wraps `comm` (already duplicated, errors set to return).
    pub(crate) fn new(
        comm: CommHandle,
        config: Config,
        algorithm: Algorithm,
        env: Arc<Env>,
    ) -> Result<MpiComm> {
        let (rank, size) = comm.rank_size().map_err(|e| CommError::Unsupported {
            backend: "mpi",
            what: e.to_string(),
        })?;
        Ok(MpiComm {
            comm,
            rank,
            size,
            config,
            algorithm,
            stage: Stage::default(),
            poison: None,
            env,
        })
    }

    fn broken(&self, desc: &OpDesc, cause: BreakCause) -> CommError {
        CommError::Broken {
            op: desc.kind,
            seq: desc.seq,
            bytes: desc.bytes(),
            rank: self.rank,
            cause,
            history: Box::default(),
        }
    }

    fn failed(&self, desc: &OpDesc, what: &str) -> CommError {
        CommError::InvalidArgument {
            what: format!(
                "mpi: {} #{} ({} bytes) on rank {}: {what}",
                desc.kind,
                desc.seq,
                desc.bytes(),
                self.rank
            ),
        }
    }

    /// Refuses to run on a poisoned communicator, then checks descriptors if asked to.
    fn begin(&mut self, desc: &OpDesc) -> Result<()> {
        match &self.poison {
            Some(Poison::Cause(c)) => return Err(self.broken(desc, c.clone())),
            Some(Poison::Mpi(m)) => {
                return Err(self.failed(desc, &format!("group unusable after: {m}")))
            }
            None => {}
        }
        if self.config.debug_checks {
            self.agree(desc)?;
        }
        Ok(())
    }

    fn agree(&mut self, desc: &OpDesc) -> Result<()> {
        let bytes = check::WORDS * 8;
        let input = self.stage.input.ensure(bytes);
        let output = self.stage.output.ensure(bytes * self.size);
        self.stage
            .input
            .bytes_mut(bytes)
            .copy_from_slice(bytemuck::cast_slice(&check::encode(desc)));
        let count = int(bytes).ok_or_else(|| too_big(desc))?;
        self.start(desc, "MPI_Iallgather", |comm, req| {
            // SAFETY: `input`/`output` are stage buffers of `bytes` and `bytes * size` bytes,
            // kept alive (or leaked) until the request completes.
            unsafe {
                ffi::MPI_Iallgather(
                    input.cast_const().cast::<c_void>(),
                    count,
                    bytes_type(),
                    output.cast(),
                    count,
                    bytes_type(),
                    comm,
                    req,
                )
            }
        })?;
        let words: &[u64] = bytemuck::cast_slice(self.stage.output.bytes(bytes * self.size));
        let mismatch = words
            .chunks_exact(check::WORDS)
            .enumerate()
            .find_map(|(peer, w)| desc.first_difference(&check::decode(w)).map(|d| (peer, d)));
        if let Some((peer, (field, value, peer_value))) = mismatch {
            // Every rank saw the same table, so every rank takes this path.
            self.poison = Some(Poison::Cause(BreakCause::Mismatch { seq: desc.seq }));
            return Err(CommError::Mismatch {
                seq: desc.seq,
                field,
                rank: self.rank,
                value,
                peer,
                peer_value,
                history: Box::default(),
            });
        }
        Ok(())
    }

    /// Starts a nonblocking call with `f(comm, &mut request)` and waits for it until the
    /// timeout. On timeout or failure the stage is abandoned (MPI may still use it) and the
    /// communicator poisoned.
    fn start(
        &mut self,
        desc: &OpDesc,
        call: &'static str,
        f: impl FnOnce(ffi::MPI_Comm, &mut ffi::MPI_Request) -> c_int,
    ) -> Result<()> {
        let mut req = null_request();
        if let Err(e) = mpi_check(call, f(self.comm.0, &mut req)) {
            // Nothing was started, so the stage is still ours.
            self.poison = Some(Poison::Mpi(e.to_string()));
            return Err(self.failed(desc, &e.to_string()));
        }
        match raw::wait(req, self.config.timeout) {
            Ok(()) => Ok(()),
            Err(raw::WaitError::TimedOut(waited)) => {
                self.stage.abandon();
                let cause = BreakCause::TimedOut {
                    rank: self.rank,
                    seq: desc.seq,
                };
                self.poison = Some(Poison::Cause(cause));
                Err(self.timeout(desc, waited))
            }
            Err(raw::WaitError::Failed(e)) => {
                self.stage.abandon();
                self.poison = Some(Poison::Mpi(e.to_string()));
                Err(self.failed(desc, &e.to_string()))
            }
        }
    }

    fn timeout(&self, desc: &OpDesc, waited: Duration) -> CommError {
        CommError::Timeout {
            op: desc.kind,
            seq: desc.seq,
            bytes: desc.bytes(),
            rank: self.rank,
            waited,
            // MPI does not say which peers are late; the local backend does.
            missing: Vec::new(),
            history: Box::default(),
        }
    }

    /// Copies the rank's input (`send`, or `recv[from..from + len]` in place) into the stage.
    fn stage_input(
        &mut self,
        send: &Option<BufRef<'_>>,
        recv: &mut BufMut<'_>,
        from: usize,
        len: usize,
    ) {
        self.stage.input.ensure(len);
        let src = match send {
            Some(s) => &bytes_of(s)[..len],
            None => &bytes_of_mut(recv)[from..from + len],
        };
        self.stage.input.bytes_mut(len).copy_from_slice(src);
    }

    /// Phase 1 of all-reduce and reduce: rank r receives chunk r (the local backend's uneven
    /// chunking) of every rank's staged input and reduces it, in rank order, into `stage.mine`.
    /// Returns this rank's chunk as an element range.
    fn reduce_own_chunk(
        &mut self,
        desc: &OpDesc,
        dt: DType,
        op: ReduceOp,
    ) -> Result<(usize, usize)> {
        let (n, p, r, es) = (desc.count, self.size, self.rank, dt.size());
        let (lo, hi) = chunk(n, p, r);
        let m = (hi - lo) * es;
        let c = self.fill_counts(desc, 4, |part, j| {
            let (jlo, jhi) = chunk(n, p, j);
            match part {
                0 => (jhi - jlo) * es,
                1 => jlo * es,
                2 => m,
                _ => j * m,
            }
        })?;
        int(p * m).ok_or_else(|| too_big(desc))?;
        let input = self.stage.input.ensure(n * es);
        let output = self.stage.output.ensure(p * m);
        self.start(desc, "MPI_Ialltoallv", |comm, req| {
            // SAFETY: the four count arrays (p ints each) and both buffers belong to the stage
            // and stay alive (or leaked) until completion; every count/displacement stays inside
            // its buffer (n * es bytes in, p * m out) by construction of `chunk`.
            unsafe {
                ffi::MPI_Ialltoallv(
                    input.cast_const().cast(),
                    c,
                    c.add(p),
                    bytes_type(),
                    output.cast(),
                    c.add(2 * p),
                    c.add(3 * p),
                    bytes_type(),
                    comm,
                    req,
                )
            }
        })?;
        self.stage.mine.ensure(m);
        let Stage { output, mine, .. } = &mut self.stage;
        reduce_chunks(dt, output.bytes(p * m), mine.bytes_mut(m), op);
        Ok((lo, hi))
    }

    /// Writes `parts` arrays of one C int per rank, `value(part, rank)`, into the staged
    /// counts and returns their start.
    fn fill_counts(
        &mut self,
        desc: &OpDesc,
        parts: usize,
        value: impl Fn(usize, usize) -> usize,
    ) -> Result<*const c_int> {
        let p = self.size;
        let bytes = parts * p * std::mem::size_of::<c_int>();
        let start = self.stage.counts.ensure(bytes).cast_const().cast::<c_int>();
        let counts: &mut [c_int] = bytemuck::cast_slice_mut(self.stage.counts.bytes_mut(bytes));
        for (i, slot) in counts.iter_mut().enumerate() {
            *slot = int(value(i / p, i % p)).ok_or_else(|| too_big(desc))?;
        }
        Ok(start)
    }

    /// Receive counts and displacements (bytes) of every rank's chunk, for the gathers.
    fn chunk_layout(&mut self, desc: &OpDesc, es: usize) -> Result<*const c_int> {
        let (n, p) = (desc.count, self.size);
        self.fill_counts(desc, 2, |part, j| {
            let (lo, hi) = chunk(n, p, j);
            if part == 0 {
                (hi - lo) * es
            } else {
                lo * es
            }
        })
    }

    fn native_all_reduce(&mut self, desc: &OpDesc, op: ReduceOp) -> Result<()> {
        let n = int(desc.count).ok_or_else(|| too_big(desc))?;
        let input = self.stage.input.ensure(desc.count * 4);
        let output = self.stage.output.ensure(desc.count * 4);
        // SAFETY: reading predefined constant handles.
        let mpi_op = unsafe {
            match op {
                ReduceOp::Sum | ReduceOp::Avg => ffi::RSMPI_SUM,
                ReduceOp::Max => ffi::RSMPI_MAX,
                ReduceOp::Min => ffi::RSMPI_MIN,
            }
        };
        self.start(desc, "MPI_Iallreduce", |comm, req| {
            // SAFETY: both stage buffers hold `count` f32s and outlive the request.
            unsafe {
                ffi::MPI_Iallreduce(
                    input.cast_const().cast(),
                    output.cast(),
                    n,
                    ffi::RSMPI_FLOAT,
                    mpi_op,
                    comm,
                    req,
                )
            }
        })?;
        if op == ReduceOp::Avg {
            let p = self.size as f32;
            let out: &mut [f32] =
                bytemuck::cast_slice_mut(self.stage.output.bytes_mut(desc.count * 4));
            out.iter_mut().for_each(|x| *x /= p);
        }
        Ok(())
    }
}

impl Drop for MpiComm {
    fn drop(&mut self) {
        // A poisoned communicator may have a request in flight; freeing it then is undefined,
        // so it is leaked with its stage.
        if self.poison.is_none() {
            self.comm.free();
        }
    }
}

impl Backend for MpiComm {
    fn name(&self) -> &'static str {
        "mpi"
    }
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }

    fn all_reduce(
        &mut self,
        desc: &OpDesc,
        send: Option<BufRef<'_>>,
        mut recv: BufMut<'_>,
        op: ReduceOp,
    ) -> Result<()> {
        self.begin(desc)?;
        let (dt, n) = (recv.dtype(), desc.count);
        let bytes = n * dt.size();
        self.stage_input(&send, &mut recv, 0, bytes);
        if self.algorithm == Algorithm::Native && dt == DType::F32 {
            self.native_all_reduce(desc, op)?;
            bytes_of_mut(&mut recv).copy_from_slice(self.stage.output.bytes(bytes));
            return Ok(());
        }
        let (lo, hi) = self.reduce_own_chunk(desc, dt, op)?;
        let c = self.chunk_layout(desc, dt.size())?;
        let m = int((hi - lo) * dt.size()).ok_or_else(|| too_big(desc))?;
        let p = self.size;
        let mine = self.stage.mine.ensure((hi - lo) * dt.size());
        // Phase 1 is complete, so the staged input is free to receive the result.
        let out = self.stage.input.ensure(bytes);
        self.start(desc, "MPI_Iallgatherv", |comm, req| {
            // SAFETY: stage buffers and count arrays (2p ints) outlive the request; chunk j
            // lands at [lo_j, hi_j) * es inside the n * es bytes of `out`.
            unsafe {
                ffi::MPI_Iallgatherv(
                    mine.cast_const().cast(),
                    m,
                    bytes_type(),
                    out.cast(),
                    c,
                    c.add(p),
                    bytes_type(),
                    comm,
                    req,
                )
            }
        })?;
        bytes_of_mut(&mut recv).copy_from_slice(self.stage.input.bytes(bytes));
        Ok(())
    }

    fn reduce_scatter(
        &mut self,
        desc: &OpDesc,
        send: Option<BufRef<'_>>,
        mut recv: BufMut<'_>,
        op: ReduceOp,
    ) -> Result<()> {
        self.begin(desc)?;
        let (dt, p) = (recv.dtype(), self.size);
        let per = desc.count / p * dt.size();
        self.stage_input(&send, &mut recv, 0, p * per);
        let count = int(per).ok_or_else(|| too_big(desc))?;
        let input = self.stage.input.ensure(p * per);
        let output = self.stage.output.ensure(p * per);
        self.start(desc, "MPI_Ialltoall", |comm, req| {
            // SAFETY: both stage buffers hold p * per bytes and outlive the request.
            unsafe {
                ffi::MPI_Ialltoall(
                    input.cast_const().cast(),
                    count,
                    bytes_type(),
                    output.cast(),
                    count,
                    bytes_type(),
                    comm,
                    req,
                )
            }
        })?;
        let at = if send.is_some() { 0 } else { self.rank * per };
        let out = &mut bytes_of_mut(&mut recv)[at..at + per];
        reduce_chunks(dt, self.stage.output.bytes(p * per), out, op);
        Ok(())
    }

    fn all_gather(
        &mut self,
        desc: &OpDesc,
        send: Option<BufRef<'_>>,
        mut recv: BufMut<'_>,
    ) -> Result<()> {
        self.begin(desc)?;
        let (dt, p) = (recv.dtype(), self.size);
        let per = desc.count / p * dt.size();
        self.stage_input(&send, &mut recv, self.rank * per, per);
        let count = int(per).ok_or_else(|| too_big(desc))?;
        int(p * per).ok_or_else(|| too_big(desc))?;
        let input = self.stage.input.ensure(per);
        let output = self.stage.output.ensure(p * per);
        self.start(desc, "MPI_Iallgather", |comm, req| {
            // SAFETY: stage buffers of per and p * per bytes, alive until completion.
            unsafe {
                ffi::MPI_Iallgather(
                    input.cast_const().cast(),
                    count,
                    bytes_type(),
                    output.cast(),
                    count,
                    bytes_type(),
                    comm,
                    req,
                )
            }
        })?;
        bytes_of_mut(&mut recv).copy_from_slice(self.stage.output.bytes(p * per));
        Ok(())
    }

    fn broadcast(
        &mut self,
        desc: &OpDesc,
        send: Option<BufRef<'_>>,
        mut recv: BufMut<'_>,
        root: usize,
    ) -> Result<()> {
        self.begin(desc)?;
        let bytes = desc.count * recv.dtype().size();
        if self.rank == root {
            self.stage_input(&send, &mut recv, 0, bytes);
        }
        let (count, root_i) = (
            int(bytes).ok_or_else(|| too_big(desc))?,
            int(root).ok_or_else(|| too_big(desc))?,
        );
        let buf = self.stage.input.ensure(bytes);
        self.start(desc, "MPI_Ibcast", |comm, req| {
            // SAFETY: a stage buffer of `bytes` bytes, alive until completion.
            unsafe { ffi::MPI_Ibcast(buf.cast(), count, bytes_type(), root_i, comm, req) }
        })?;
        if self.rank != root || send.is_some() {
            bytes_of_mut(&mut recv).copy_from_slice(self.stage.input.bytes(bytes));
        }
        Ok(())
    }

    fn reduce(
        &mut self,
        desc: &OpDesc,
        send: Option<BufRef<'_>>,
        mut recv: BufMut<'_>,
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        self.begin(desc)?;
        let (dt, n) = (desc.dtype.unwrap_or(recv.dtype()), desc.count);
        let bytes = n * dt.size();
        self.stage_input(&send, &mut recv, 0, bytes);
        let (lo, hi) = self.reduce_own_chunk(desc, dt, op)?;
        let c = self.chunk_layout(desc, dt.size())?;
        let m = int((hi - lo) * dt.size()).ok_or_else(|| too_big(desc))?;
        let root_i = int(root).ok_or_else(|| too_big(desc))?;
        let p = self.size;
        let mine = self.stage.mine.ensure((hi - lo) * dt.size());
        let out = self.stage.input.ensure(bytes);
        self.start(desc, "MPI_Igatherv", |comm, req| {
            // SAFETY: as the all-gather phase of all-reduce; only the root's `out` is written.
            unsafe {
                ffi::MPI_Igatherv(
                    mine.cast_const().cast(),
                    m,
                    bytes_type(),
                    out.cast(),
                    c,
                    c.add(p),
                    bytes_type(),
                    root_i,
                    comm,
                    req,
                )
            }
        })?;
        if self.rank == root {
            bytes_of_mut(&mut recv).copy_from_slice(self.stage.input.bytes(bytes));
        }
        Ok(())
    }

    fn barrier(&mut self, desc: &OpDesc) -> Result<()> {
        self.begin(desc)?;
        self.start(desc, "MPI_Ibarrier", |comm, req| {
            // SAFETY: no buffers; `req` is a live out-pointer.
            unsafe { ffi::MPI_Ibarrier(comm, req) }
        })
    }

    fn split(&mut self, desc: &OpDesc, color: u32, key: u32) -> Result<Box<dyn Backend>> {
        let (Some(color_i), Some(key_i)) = (int(color as usize), int(key as usize)) else {
            return Err(CommError::InvalidArgument {
                what: format!("mpi split: color {color} and key {key} must be below 2^31"),
            });
        };
        // The barrier bounds the wait by the timeout: MPI_Comm_split itself blocks, but once
        // every rank has passed the barrier it only waits for ranks that are already there.
        self.barrier(desc)?;
        // SAFETY: predefined constant handle, overwritten by MPI_Comm_split.
        let mut child = unsafe { ffi::RSMPI_COMM_NULL };
        // SAFETY: valid communicator; `child` is a live local.
        let rc = unsafe { ffi::MPI_Comm_split(self.comm.0, color_i, key_i, &mut child) };
        mpi_check("MPI_Comm_split", rc).map_err(|e| self.failed(desc, &e.to_string()))?;
        let child = CommHandle(child);
        if let Err(e) = child.errors_return() {
            child.free();
            return Err(self.failed(desc, &e.to_string()));
        }
        let backend = MpiComm::new(child, self.config, self.algorithm, Arc::clone(&self.env))?;
        Ok(Box::new(backend))
    }

    fn leave_handle(&self) -> Arc<dyn Leave> {
        Arc::new(NoLeave)
    }

    fn staging_rule(&self) -> StagingRule {
        let floor_bytes = if self.config.debug_checks {
            (check::WORDS * 8) as u64
        } else {
            0
        };
        StagingRule::Copies {
            ranks: self.size,
            floor_bytes,
        }
    }

    fn provide_staging(&mut self, block: Lent<u64>, layout: StagingLayout) -> Result<()> {
        if self.poison.is_some() {
            // The stage may have been abandoned to a pending request; this one stays unused.
            return Err(CommError::InvalidArgument {
                what: "mpi: staging provided to a broken communicator".into(),
            });
        }
        // No request is pending (collectives complete before returning), so the heap
        // buffers this frees are ours.
        self.stage.provide(block, layout).map_err(|(block, what)| {
            // Dropped without being taken back: the block stays pinned, unused.
            drop(block);
            CommError::InvalidArgument {
                what: format!("mpi: {what}"),
            }
        })
    }

    fn staging_outside_bytes(&self) -> u64 {
        self.stage.outside_bytes()
    }
}
