//! The tensor-parallel group's traffic per optimizer step, read off the split model's own
//! program: every [`TpOp::AllReduce`] of a training micro-step sums f32s of one micro-batch
//! of N = B·T positions: (N, C) activations or their gradients, except the loss statistics
//! after the vocabulary-split head's forward, (N, T+1). The engine's gradient norm adds one
//! all-gather of an f64 per rank each step, and fp16's loss scaling one all-reduce of an f32
//! overflow flag. The same at every ZeRO stage: ZeRO partitions
//! over the data-parallel group only.

use zero_comm::{ring_bytes, DType, OpDesc, OpKind};
use zero_gpt::{tp_train_ops, GptConfig, TpOp};

use crate::bridge::split_layout;
use crate::cli::config::{PrecisionArg, TrainConfig};

/// One rank's collectives over its tensor-parallel group per optimizer step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TpTrafficPlan {
    /// All-reduces of the model's sums.
    pub all_reduces: u64,
    /// All-gathers (the norm's partial sums).
    pub all_gathers: u64,
    /// Bytes a rank sends, as zero-comm counts them (received is the same).
    pub bytes_sent: u64,
}

/// The plan for `cfg` on `model`; `None` at T = 1.
pub fn tp_traffic_plan(cfg: &TrainConfig, model: &GptConfig) -> Option<TpTrafficPlan> {
    let t = cfg.tensor_parallel_size;
    if t <= 1 {
        return None;
    }
    let every = cfg.activation_placement().checkpoint_every;
    let vocab = split_layout(model, t).vocab_parallel();
    let program = tp_train_ops(model.num_layers, every, vocab);
    let n = cfg.micro_batch_size.saturating_mul(cfg.seq_len);
    let sums = program.windows(2).filter(|w| w[1] == TpOp::AllReduce);
    // Saturating: a figure to print, from flags that may multiply past u64.
    let (mut count, mut bytes) = (0u64, 0u64);
    for w in sums {
        let floats = match w[0] {
            TpOp::HeadSlice => n.saturating_mul(t + 1),
            _ => n.saturating_mul(model.channels),
        };
        count += 1;
        let sum = desc(OpKind::AllReduce, floats, DType::F32);
        bytes = bytes.saturating_add(ring_bytes(&sum, 0, t).0);
    }
    let micro_steps = cfg.grad_accum_steps() as u64;
    let norm = desc(OpKind::AllGather, t, DType::F64);
    // fp16's loss scaling agrees on one overflow flag over the group each step.
    let flag = u64::from(cfg.precision == PrecisionArg::Fp16);
    let flag_bytes = flag * ring_bytes(&desc(OpKind::AllReduce, 1, DType::F32), 0, t).0;
    Some(TpTrafficPlan {
        all_reduces: count.saturating_mul(micro_steps).saturating_add(flag),
        all_gathers: 1,
        bytes_sent: bytes
            .saturating_mul(micro_steps)
            .saturating_add(ring_bytes(&norm, 0, t).0)
            .saturating_add(flag_bytes),
    })
}

fn desc(kind: OpKind, count: usize, dtype: DType) -> OpDesc {
    OpDesc {
        seq: 0,
        kind,
        dtype: Some(dtype),
        count,
        root: None,
        op: None,
    }
}
