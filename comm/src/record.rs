//! Observability: per-communicator counters and a bounded history of the last operations.

use std::collections::VecDeque;
use std::fmt;
use std::time::Duration;

use crate::op::{OpDesc, OpKind};

/// Counters of one communicator since its creation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Collectives completed (successfully or not).
    pub ops: u64,
    /// Collectives that returned an error.
    pub failed: u64,
    /// Bytes this rank sends under ring accounting (see [`ring_bytes`]).
    pub bytes_sent: u64,
    /// Bytes this rank receives under ring accounting.
    pub bytes_received: u64,
    /// Wall time spent inside collectives on this rank.
    pub time: Duration,
    /// Collectives completed, by kind, indexed as [`OpKind::ALL`] lists them (read with
    /// [`Stats::ops_of`]).
    pub ops_by_kind: [u64; OpKind::ALL.len()],
}

impl Stats {
    /// Collectives of `kind` completed (successfully or not).
    pub fn ops_of(&self, kind: OpKind) -> u64 {
        self.ops_by_kind[kind.index()]
    }
}

/// Bytes one rank (`rank` of `size`) sends and receives for `desc` under the usual ring
/// accounting: (N-1)/N of the array for reduce-scatter and all-gather, twice that for
/// all-reduce, the whole array out of the root (broadcast) or into it (reduce).
pub fn ring_bytes(desc: &OpDesc, rank: usize, size: usize) -> (u64, u64) {
    let s = desc.bytes() as u64;
    let n = size.max(1) as u64;
    let part = s * (n - 1) / n;
    let is_root = desc.root == Some(rank);
    match desc.kind {
        OpKind::AllReduce => (2 * part, 2 * part),
        OpKind::ReduceScatter | OpKind::AllGather => (part, part),
        OpKind::Broadcast if n > 1 => (if is_root { s } else { 0 }, if is_root { 0 } else { s }),
        OpKind::Reduce if n > 1 => (if is_root { 0 } else { s }, if is_root { s } else { 0 }),
        _ => (0, 0),
    }
}

/// One finished operation in the history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpRecord {
    /// The call.
    pub desc: OpDesc,
    /// How long it took on this rank.
    pub elapsed: Duration,
    /// True when it returned `Ok`.
    pub ok: bool,
}

/// The last few operations of a communicator, oldest first; printed with every error.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct History {
    /// The rank that recorded it.
    pub rank: usize,
    /// The records, oldest first.
    pub records: VecDeque<OpRecord>,
    capacity: usize,
}

impl History {
    /// An empty history keeping at most `capacity` records.
    pub fn new(rank: usize, capacity: usize) -> Self {
        History {
            rank,
            records: VecDeque::with_capacity(capacity),
            capacity,
        }
    }

    /// Appends a record, dropping the oldest when full.
    pub fn push(&mut self, record: OpRecord) {
        if self.capacity == 0 {
            return;
        }
        if self.records.len() == self.capacity {
            self.records.pop_front();
        }
        self.records.push_back(record);
    }
}

impl fmt::Display for History {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.records.is_empty() {
            return Ok(());
        }
        write!(
            f,
            "\n  last {} ops on rank {}:",
            self.records.len(),
            self.rank
        )?;
        for r in &self.records {
            let d = &r.desc;
            write!(f, "\n    #{} {}", d.seq, d.kind)?;
            if let Some(t) = d.dtype {
                write!(f, " {t} x{} ({} B)", d.count, d.bytes())?;
            }
            if let Some(op) = d.op {
                write!(f, " {op}")?;
            }
            if let Some(root) = d.root {
                write!(f, " root={root}")?;
            }
            write!(f, " {:?} {}", r.elapsed, if r.ok { "ok" } else { "FAILED" })?;
        }
        Ok(())
    }
}

/// Counters and history together, as a communicator keeps them.
#[derive(Debug, Clone)]
pub(crate) struct Recorder {
    pub stats: Stats,
    pub history: History,
}

impl Recorder {
    pub fn new(rank: usize, capacity: usize) -> Self {
        Recorder {
            stats: Stats::default(),
            history: History::new(rank, capacity),
        }
    }

    pub fn record(&mut self, desc: &OpDesc, size: usize, elapsed: Duration, ok: bool) {
        let (sent, received) = ring_bytes(desc, self.history.rank, size);
        self.stats.ops += 1;
        self.stats.ops_by_kind[desc.kind.index()] += 1;
        self.stats.failed += u64::from(!ok);
        self.stats.bytes_sent += sent;
        self.stats.bytes_received += received;
        self.stats.time += elapsed;
        self.history.push(OpRecord {
            desc: *desc,
            elapsed,
            ok,
        });
    }
}
