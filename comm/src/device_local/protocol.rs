//! The protocol of `mod.rs`, steps 2-6, over any [`DeviceOps`], for a call that step 1
//! (`checks.rs`) has described.

use std::sync::Arc;

use super::rendezvous::{ExchangeError, Phase, Slot};
use super::{DeviceLocalComm, DeviceOps, RawBuf};
use crate::chunk::chunk;
use crate::dtype::DType;
use crate::error::{BreakCause, CommError, Result};
use crate::op::{OpDesc, OpKind};
use crate::reduce_op::ReduceOp;

fn to_error(rank: usize, desc: &OpDesc, e: ExchangeError) -> CommError {
    match e {
        ExchangeError::Timeout { missing, waited } => CommError::Timeout {
            op: desc.kind,
            seq: desc.seq,
            bytes: desc.bytes(),
            rank,
            waited,
            missing,
            history: Box::default(),
        },
        ExchangeError::Broken(cause) => CommError::Broken {
            op: desc.kind,
            seq: desc.seq,
            bytes: desc.bytes(),
            rank,
            cause,
            history: Box::default(),
        },
    }
}

type Table<E> = Arc<Vec<Arc<Slot<E>>>>;

impl<O: DeviceOps> DeviceLocalComm<O> {
    /// Marks this rank's stream work so far: an event, or (when recording fails) a
    /// synchronised stream and no event (step 6).
    fn mark(&self) -> (Option<O::Event>, Option<CommError>) {
        match self.ops.record() {
            Ok(e) => (Some(e), None),
            Err(e) => (None, self.ops.synchronize().err().or(Some(e))),
        }
    }

    /// Exchanges a slot and orders this rank's stream after every peer's published event.
    /// `earlier` is a failure of this rank's own work in the phase, reported after the
    /// exchange so that every rank still passes it.
    fn exchange(
        &self,
        desc: &OpDesc,
        send: u64,
        recv: u64,
        phase: Phase,
        earlier: Option<CommError>,
    ) -> Result<Table<O::Event>> {
        let (event, failed) = self.mark();
        let slot = Slot {
            desc: *desc,
            send,
            recv,
            event,
        };
        let table = self
            .shared
            .exchange(self.rank, slot, phase)
            .map_err(|e| to_error(self.rank, desc, e))?;
        let mut first = earlier.or(failed);
        for peer in table.iter().filter_map(|s| s.event.as_ref()) {
            if let Err(e) = self.ops.wait(peer) {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(table), Err)
    }

    /// Step 4: the same answer on every rank, since every rank reads the same table.
    fn check_agreement(&self, desc: &OpDesc, table: &Table<O::Event>) -> Result<()> {
        let mismatch = table
            .iter()
            .enumerate()
            .find_map(|(peer, s)| desc.first_difference(&s.desc).map(|d| (peer, d)));
        let Some((peer, (field, value, peer_value))) = mismatch else {
            return Ok(());
        };
        self.exchange(desc, 0, 0, Phase::Committed, None)?;
        self.shared
            .break_with(BreakCause::Mismatch { seq: desc.seq });
        Err(CommError::Mismatch {
            seq: desc.seq,
            field,
            rank: self.rank,
            value,
            peer,
            peer_value,
            history: Box::default(),
        })
    }
}

pub(super) fn barrier<O: DeviceOps>(comm: &DeviceLocalComm<O>) -> Result<()> {
    let desc = OpDesc {
        seq: comm.seq,
        kind: OpKind::Barrier,
        dtype: None,
        count: 0,
        root: None,
        op: None,
    };
    let table = comm.exchange(&desc, 0, 0, Phase::Entry, None)?;
    comm.check_agreement(&desc, &table)
}

/// Where a rank's input starts: its send buffer, or for the in-place forms its recv buffer
/// (chunk r of it for all-gather).
fn input_addr(desc: &OpDesc, rank: usize, size: usize, send: Option<RawBuf>, recv: RawBuf) -> u64 {
    match (send, desc.kind) {
        (Some(s), _) => s.addr,
        (None, OpKind::AllGather) => recv.addr + byte_offset(desc, rank * (desc.count / size)),
        (None, _) => recv.addr,
    }
}

/// Bytes of `elems` elements; step 1 checked that the whole array's bytes fit in usize.
fn byte_offset(desc: &OpDesc, elems: usize) -> u64 {
    (elems * desc.dtype.map_or(0, DType::size)) as u64
}

/// Steps 2-6 for a described call.
///
/// # Safety
/// As [`DeviceLocalComm::run_raw`].
pub(super) unsafe fn run<O: DeviceOps>(
    comm: &DeviceLocalComm<O>,
    desc: OpDesc,
    send: Option<RawBuf>,
    recv: RawBuf,
) -> Result<()> {
    let (rank, size) = (comm.rank, comm.size);
    let input = input_addr(&desc, rank, size, send, recv);
    let table = comm.exchange(&desc, input, recv.addr, Phase::Entry, None)?;
    comm.check_agreement(&desc, &table)?;
    let dt = desc.dtype.unwrap_or(DType::F32);
    let at = |addr: u64, elems: usize| addr + byte_offset(&desc, elems);
    let inputs = |lo: usize| -> Vec<u64> { table.iter().map(|s| at(s.send, lo)).collect() };
    let (mine, n) = (&table[rank], desc.count);
    let issued = match desc.kind {
        OpKind::AllReduce => {
            let (lo, hi) = chunk(n, size, rank);
            // SAFETY: S1; S2 (rank r writes only its chunk r, every rank reads only chunk j of
            // the inputs for its own j); S3 (chunk r lies inside every buffer of n elements).
            let r = unsafe {
                comm.ops.reduce_in_rank_order(
                    dt,
                    redop(&desc),
                    at(mine.recv, lo),
                    &inputs(lo),
                    hi - lo,
                )
            };
            comm.exchange(&desc, 0, 0, Phase::Committed, r.err())?;
            copy_chunks(comm, &desc, &table, |j| chunk(n, size, j))
        }
        OpKind::ReduceScatter => {
            let per = n / size;
            let out = if send.is_none() {
                at(mine.recv, rank * per)
            } else {
                mine.recv
            };
            // SAFETY: S1; S2 (each rank writes its own output, reads chunk r of inputs no
            // rank writes: an in-place rank writes chunk r of its buffer, read only by the
            // reduction that writes it); S3 (step 1 checked send = per * size elements).
            unsafe {
                comm.ops
                    .reduce_in_rank_order(dt, redop(&desc), out, &inputs(rank * per), per)
            }
        }
        OpKind::AllGather => gather(comm, &desc, &table, n / size),
        OpKind::Broadcast => {
            let root = desc.root.unwrap_or(0);
            copy_unless_same(comm, table[root].send, mine.recv, byte_offset(&desc, n))
        }
        OpKind::Reduce | OpKind::Barrier | OpKind::Split => Ok(()),
    };
    comm.exchange(&desc, 0, 0, Phase::Committed, issued.err())
        .map(drop)
}

fn redop(desc: &OpDesc) -> ReduceOp {
    desc.op.unwrap_or(ReduceOp::Sum)
}

/// Enqueues a copy of `bytes` bytes unless source and destination are the same buffer (an
/// in-place rank's own input).
fn copy_unless_same<O: DeviceOps>(
    comm: &DeviceLocalComm<O>,
    src: u64,
    dst: u64,
    bytes: u64,
) -> Result<()> {
    if src == dst || bytes == 0 {
        return Ok(());
    }
    // SAFETY: S1; S2 (the source is a peer's input or a chunk finished in an earlier phase,
    // written by no rank in this phase; the destination is this rank's own recv); S3.
    unsafe { comm.ops.copy(dst, src, bytes as usize) }
}

/// All-reduce's second phase: chunk j of rank j's recv into chunk j of this rank's recv.
fn copy_chunks<O: DeviceOps>(
    comm: &DeviceLocalComm<O>,
    desc: &OpDesc,
    table: &Table<O::Event>,
    chunk_of: impl Fn(usize) -> (usize, usize),
) -> Result<()> {
    let mine = table[comm.rank].recv;
    for j in (0..comm.size).filter(|&j| j != comm.rank) {
        let (lo, hi) = chunk_of(j);
        let (src, dst) = (
            table[j].recv + byte_offset(desc, lo),
            mine + byte_offset(desc, lo),
        );
        copy_unless_same(comm, src, dst, byte_offset(desc, hi - lo))?;
    }
    Ok(())
}

/// All-gather: every rank's input into chunk j of this rank's recv.
fn gather<O: DeviceOps>(
    comm: &DeviceLocalComm<O>,
    desc: &OpDesc,
    table: &Table<O::Event>,
    per: usize,
) -> Result<()> {
    let mine = table[comm.rank].recv;
    for (j, slot) in table.iter().enumerate() {
        copy_unless_same(
            comm,
            slot.send,
            mine + byte_offset(desc, j * per),
            byte_offset(desc, per),
        )?;
    }
    Ok(())
}
