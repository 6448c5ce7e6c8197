//! The tensor-parallel group's collectives per training step, as zero-comm counts them: the
//! model's sums (Megatron's `f` backward and `g` forward, each an all-reduce of one
//! micro-batch's (B·T, C) activations) and the engine's exchanges over the group (the
//! gradient norm's partial sums, fp16's overflow flag).

use serde_json::{json, Value};
use zero_comm::{OpKind, Stats};

/// Counts of the group's collectives summed over the training steps run (evaluation and
/// sampling, which also sum over the group, are not counted).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct TpCounter {
    ops_by_kind: [u64; OpKind::ALL.len()],
    sent: u64,
    received: u64,
}

impl TpCounter {
    /// Adds what the group's communicator counted between `before` and `after`.
    pub fn add(&mut self, before: &Stats, after: &Stats) {
        for kind in OpKind::ALL {
            self.ops_by_kind[kind.index()] += after.ops_of(kind) - before.ops_of(kind);
        }
        self.sent += after.bytes_sent - before.bytes_sent;
        self.received += after.bytes_received - before.bytes_received;
    }

    /// The means over `steps` training steps.
    pub fn per_step(&self, steps: u64) -> TpTrafficPerStep {
        let steps = steps.max(1) as f64;
        let of = |kind: OpKind| self.ops_by_kind[kind.index()] as f64 / steps;
        TpTrafficPerStep {
            all_reduces: of(OpKind::AllReduce),
            all_gathers: of(OpKind::AllGather),
            ops: self.ops_by_kind.iter().sum::<u64>() as f64 / steps,
            bytes_sent: self.sent as f64 / steps,
            bytes_received: self.received as f64 / steps,
        }
    }
}

/// One rank's tensor-parallel collectives per training step (means over the steps run).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TpTrafficPerStep {
    /// All-reduces: the model's sums, and fp16's overflow flag.
    pub all_reduces: f64,
    /// All-gathers: the gradient norm's partial sums.
    pub all_gathers: f64,
    /// Collectives of every kind.
    pub ops: f64,
    /// Bytes sent under ring accounting (zero-comm's `ring_bytes`).
    pub bytes_sent: f64,
    /// Bytes received under ring accounting.
    pub bytes_received: f64,
}

impl TpTrafficPerStep {
    /// The entry in the `--metrics` summary line.
    pub fn to_json(&self) -> Value {
        json!({
            "all_reduces": self.all_reduces,
            "all_gathers": self.all_gathers,
            "collectives": self.ops,
            "bytes_sent": self.bytes_sent,
            "bytes_received": self.bytes_received,
        })
    }
}
