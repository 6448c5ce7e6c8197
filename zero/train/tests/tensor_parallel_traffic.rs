//! The tensor-parallel group's collectives per training step, as each rank's communicator
//! counts them, against the count derived on paper from Megatron's split of a block:
//!
//! - forward: one all-reduce after the row-parallel attention projection and one after the
//!   row-parallel MLP projection (`g`), 2 per block;
//! - backward: one all-reduce of the input gradient of the column-parallel QKV and MLP-up
//!   products (`f`'s backward), 2 per block;
//! - with checkpointing, the recompute of a block repeats its 2 forward all-reduces, for
//!   every block but those of the last segment;
//! - the vocabulary split (Megatron's vocab-parallel embedding and cross-entropy): the
//!   embedding's partial rows, the loss statistics (per position, each rank's log-sum-exp in
//!   its own column and the target's logit: T + 1 floats) and the head's partial d(lnf), 3
//!   per micro-step;
//! - each of those sums f32s of a micro-batch's N = B·seq_len positions, (N, C), the
//!   statistics (N, T+1): under
//!   ring accounting a rank sends 2 (T-1)/T of those bytes for each;
//! - once per step, the gradient norm's partial sums: an all-gather of one f64 per rank,
//!   8 (T-1) bytes sent.
//!
//! Evaluation runs forward over the group too; it is not a training step and not counted.

mod common;
use common::{learnable_corpus, TempDir};

use std::path::Path;
use zero::ZeroStage;
use zero_train::plan::tp_traffic::tp_traffic_plan;
use zero_train::{train, PrecisionArg, TrainConfig};

const SEQ: usize = 16;
const WIDTH: usize = 32;

fn config(data: &Path, tp: usize, layers: usize, heads: usize) -> TrainConfig {
    TrainConfig {
        model: "tiny".into(),
        layers: Some(layers),
        heads: Some(heads),
        dim: Some(WIDTH),
        seq_len: SEQ,
        data: data.to_path_buf(),
        world_size: 4,
        tensor_parallel_size: tp,
        zero_stage: ZeroStage::Zero3,
        steps: 3,
        batch_size: 4,
        micro_batch_size: 1,
        eval_every: 2,
        eval_batches: tp,
        sample_tokens: 0,
        ..TrainConfig::default()
    }
}

/// What each rank's tensor-parallel communicator must count per step, from the module's
/// derivation: (all-reduces, all-gathers, bytes sent).
fn on_paper(cfg: &TrainConfig, recomputed_blocks: usize) -> (f64, f64, f64) {
    let t = cfg.tensor_parallel_size;
    let layers = cfg.layers.unwrap();
    let micro_steps = cfg.batch_size / (cfg.world_size / t) / cfg.micro_batch_size;
    let wide_sums = 4 * layers + 2 * recomputed_blocks + 2;
    let all_reduces = (wide_sums + 1) * micro_steps;
    let positions = cfg.micro_batch_size * SEQ;
    let wide_bytes = positions * WIDTH * 4;
    let stats_bytes = positions * (t + 1) * 4;
    let per_micro_step = (wide_sums * wide_bytes + stats_bytes) * 2 * (t - 1) / t;
    // fp16: one all-reduce of the overflow flag (one f32) a step.
    let flag = usize::from(cfg.precision == PrecisionArg::Fp16);
    let flag_bytes = flag * 2 * (4 * (t - 1) / t);
    let sent = per_micro_step * micro_steps + 8 * (t - 1) + flag_bytes;
    ((all_reduces + flag) as f64, 1.0, sent as f64)
}

/// Each rank's count against the paper's, and `zero-train plan`'s (read off the program)
/// against both.
fn check(cfg: &TrainConfig, recomputed_blocks: usize) {
    let run = train(cfg).unwrap();
    let (all_reduces, all_gathers, sent) = on_paper(cfg, recomputed_blocks);
    let plan = tp_traffic_plan(cfg, &cfg.validate().unwrap()).unwrap();
    assert_eq!(plan.all_reduces as f64, all_reduces, "plan");
    assert_eq!(plan.all_gathers as f64, all_gathers, "plan");
    assert_eq!(plan.bytes_sent as f64, sent, "plan");
    assert_eq!(run.ranks.len(), cfg.world_size);
    for r in &run.ranks {
        let what = format!("rank {} of {cfg:?}", r.rank);
        let tp = r
            .tensor_parallel
            .expect("a split run reports its group's traffic");
        assert_eq!(tp.all_reduces, all_reduces, "{what}");
        assert_eq!(tp.all_gathers, all_gathers, "{what}");
        assert_eq!(tp.ops, all_reduces + all_gathers, "no other kind: {what}");
        assert_eq!(tp.bytes_sent, sent, "{what}");
        assert_eq!(tp.bytes_received, sent, "{what}");
    }
}

#[test]
fn two_layers_at_two_way_count_four_sums_a_block_per_micro_step_and_the_norm() {
    let dir = TempDir::new("tp-traffic");
    learnable_corpus(&dir.0);
    check(&config(&dir.0, 2, 2, 2), 0);
}

#[test]
fn checkpointing_adds_the_recomputed_blocks_forward_sums() {
    let dir = TempDir::new("tp-traffic-ckpt");
    learnable_corpus(&dir.0);
    // 3 blocks checkpointed one by one: blocks 0 and 1 are recomputed, block 2 is not.
    let cfg = TrainConfig {
        activation_checkpointing: true,
        ..config(&dir.0, 2, 3, 2)
    };
    check(&cfg, 2);
}

#[test]
fn four_way_sends_three_quarters_of_each_sum_twice() {
    let dir = TempDir::new("tp-traffic-four");
    learnable_corpus(&dir.0);
    check(&config(&dir.0, 4, 2, 4), 0);
}

#[test]
fn an_unsplit_run_reports_no_tensor_parallel_traffic() {
    let dir = TempDir::new("tp-traffic-none");
    learnable_corpus(&dir.0);
    let cfg = config(&dir.0, 1, 2, 2);
    let run = train(&cfg).unwrap();
    assert!(run.ranks.iter().all(|r| r.tensor_parallel.is_none()));
    assert_eq!(tp_traffic_plan(&cfg, &cfg.validate().unwrap()), None);
}

#[test]
fn fp16_adds_the_overflow_flag_once_a_step() {
    let dir = TempDir::new("tp-traffic-fp16");
    learnable_corpus(&dir.0);
    let cfg = TrainConfig {
        precision: PrecisionArg::Fp16,
        ..config(&dir.0, 2, 2, 2)
    };
    check(&cfg, 0);
}
