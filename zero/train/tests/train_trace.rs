//! `zero-train --trace FILE`: one Chrome trace document holding every rank's timeline of the
//! first `--trace-steps` steps: every operation of the GPT's training program once per
//! micro-step, kept-input copies with `--offload-activations`, the ranks and tracks named; and
//! the run's losses unchanged by tracing.

mod common;
use common::{write_corpus, TempDir};
use serde_json::Value;
use zero::ZeroStage;
use zero_gpt::{train_ops, Rng};
use zero_train::{train, TrainConfig};

fn run(dir: &std::path::Path, trace: Option<std::path::PathBuf>) -> Vec<f32> {
    train(&TrainConfig {
        model: "tiny".into(),
        layers: Some(3),
        seq_len: 16,
        data: dir.to_path_buf(),
        world_size: 2,
        steps: 3,
        batch_size: 4,
        micro_batch_size: 1,
        eval_every: 0,
        sample_tokens: 0,
        zero_stage: ZeroStage::Zero3,
        activation_checkpointing: true,
        offload_activations: true,
        trace,
        trace_steps: 2,
        ..TrainConfig::default()
    })
    .unwrap()
    .losses
}

#[test]
fn the_trace_holds_every_operation_of_the_traced_steps_on_every_rank() {
    let dir = TempDir::new("trace");
    let mut rng = Rng::new(5);
    let tokens: Vec<u16> = (0..4_000).map(|_| (rng.next_u64() % 100) as u16).collect();
    write_corpus(&dir.0, &tokens, 1_000, 100);
    let path = dir.0.join("timeline.json");
    let traced = run(&dir.0, Some(path.clone()));
    assert_eq!(traced, run(&dir.0, None), "tracing changed the losses");
    let doc: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let events = doc["traceEvents"].as_array().unwrap();
    let ops = train_ops(3, Some(1)).len();
    // 2 traced steps x 2 micro-steps per rank (batch 4 on 2 ranks of micro-batch 1).
    let micro_steps = 2 * 2;
    for rank in 0..2 {
        let on_track = |tid: u64| {
            events
                .iter()
                .filter(|e| e["ph"] == "X" && e["pid"] == rank && e["tid"] == tid)
                .count()
        };
        assert_eq!(
            on_track(1),
            micro_steps * ops,
            "rank {rank}: model operations"
        );
        // 3 layers, checkpointing every block: 2 recomputed segments, each copied out and back.
        assert_eq!(
            on_track(3),
            micro_steps * 2 * 2,
            "rank {rank}: kept-input copies"
        );
        let named = events.iter().any(|e| {
            e["ph"] == "M" && e["pid"] == rank && e["args"]["name"] == format!("rank {rank}")
        });
        assert!(named, "rank {rank} is named");
    }
}
