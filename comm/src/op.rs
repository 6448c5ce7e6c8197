//! What a collective call is: its kind and the description every rank must agree on.

use crate::dtype::DType;
use crate::reduce_op::ReduceOp;

/// The kind of a collective operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// Every rank ends with the reduction of all ranks' arrays.
    AllReduce,
    /// Rank r ends with chunk r of the reduction.
    ReduceScatter,
    /// Every rank ends with the concatenation of all ranks' chunks.
    AllGather,
    /// Every rank ends with the root's array.
    Broadcast,
    /// The root ends with the reduction of all ranks' arrays.
    Reduce,
    /// No data; returns once every rank has arrived.
    Barrier,
    /// Makes sub-communicators.
    Split,
}

impl OpKind {
    /// Every kind, in declaration order: the codes the MPI descriptor check and the TCP wire
    /// format give them are their indices here.
    pub const ALL: [OpKind; 7] = [
        OpKind::AllReduce,
        OpKind::ReduceScatter,
        OpKind::AllGather,
        OpKind::Broadcast,
        OpKind::Reduce,
        OpKind::Barrier,
        OpKind::Split,
    ];

    /// The kind's position in [`OpKind::ALL`].
    pub const fn index(self) -> usize {
        match self {
            OpKind::AllReduce => 0,
            OpKind::ReduceScatter => 1,
            OpKind::AllGather => 2,
            OpKind::Broadcast => 3,
            OpKind::Reduce => 4,
            OpKind::Barrier => 5,
            OpKind::Split => 6,
        }
    }

    /// The snake_case name used by `zero-bench` and in messages.
    pub const fn name(self) -> &'static str {
        match self {
            OpKind::AllReduce => "all_reduce",
            OpKind::ReduceScatter => "reduce_scatter",
            OpKind::AllGather => "all_gather",
            OpKind::Broadcast => "broadcast",
            OpKind::Reduce => "reduce",
            OpKind::Barrier => "barrier",
            OpKind::Split => "split",
        }
    }
}

impl std::fmt::Display for OpKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One collective call as every rank must issue it at the same sequence number.
///
/// `count` is the length of the larger buffer the call sees (the whole array for
/// reduce-scatter input and all-gather output), so all ranks agree on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpDesc {
    /// Position of this call in the communicator's stream of collectives (from 0).
    pub seq: u64,
    /// What the call is.
    pub kind: OpKind,
    /// Element type; `None` for barrier and split.
    pub dtype: Option<DType>,
    /// Elements of the whole array.
    pub count: usize,
    /// Root rank for broadcast and reduce.
    pub root: Option<usize>,
    /// Reduction for all-reduce, reduce-scatter and reduce.
    pub op: Option<ReduceOp>,
}

impl OpDesc {
    /// Bytes of the whole array.
    pub fn bytes(&self) -> usize {
        self.count * self.dtype.map_or(0, DType::size)
    }

    /// The first field in which `self` and `other` differ, as (name, self's value, other's).
    pub fn first_difference(&self, other: &OpDesc) -> Option<(&'static str, String, String)> {
        if self.kind != other.kind {
            return Some(("op", self.kind.to_string(), other.kind.to_string()));
        }
        if self.dtype != other.dtype {
            return Some((
                "dtype",
                format!("{:?}", self.dtype),
                format!("{:?}", other.dtype),
            ));
        }
        if self.count != other.count {
            return Some(("count", self.count.to_string(), other.count.to_string()));
        }
        if self.root != other.root {
            return Some((
                "root",
                format!("{:?}", self.root),
                format!("{:?}", other.root),
            ));
        }
        if self.op != other.op {
            return Some(("redop", format!("{:?}", self.op), format!("{:?}", other.op)));
        }
        None
    }
}
