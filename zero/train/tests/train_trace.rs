//! `zero-train --trace FILE`: one Chrome trace document holding every rank's timeline of the
//! first `--trace-steps` steps: every operation of the GPT's training program once per
//! micro-step, kept-input copies with `--offload-activations`, the ranks and tracks named, the
//! last traced step's delayed parameter update (which lands after the recording stops); and
//! the run's losses unchanged by tracing.

mod common;
use common::{offload_corpus, write_corpus, TempDir};
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

/// Span names on rank 0's optimizer track (tid 4) of the trace at `path`.
fn optimizer_spans(path: &std::path::Path) -> Vec<String> {
    let doc: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let events = doc["traceEvents"].as_array().unwrap();
    events
        .iter()
        .filter(|e| e["ph"] == "X" && e["pid"] == 0 && e["tid"] == 4)
        .map(|e| e["name"].as_str().unwrap().to_string())
        .collect()
}

/// With `--delayed-param-update`, step t's update runs during step t+1 and lands there; the
/// last traced step's update lands after the recording stopped and is still drawn, once per
/// unit, beside the steps' own spans.
#[test]
fn the_last_traced_step_s_delayed_update_is_drawn() {
    let dir = TempDir::new("trace-delayed");
    offload_corpus(&dir.0, 9);
    let layers = 2;
    for (steps, trace_steps) in [(4u64, 2u64), (2, 2)] {
        let path = dir.0.join(format!("delayed-{steps}.json"));
        train(&TrainConfig {
            model: "tiny".into(),
            layers: Some(layers),
            seq_len: 16,
            data: dir.0.clone(),
            world_size: 2,
            steps,
            batch_size: 2,
            micro_batch_size: 1,
            eval_every: 0,
            sample_tokens: 0,
            offload_optimizer: zero_train::OffloadTier::Cpu,
            delayed_param_update: true,
            trace: Some(path.clone()),
            trace_steps,
            ..TrainConfig::default()
        })
        .unwrap();
        let names = optimizer_spans(&path);
        let count = |prefix: &str| names.iter().filter(|n| n.starts_with(prefix)).count();
        // The GPT's units: the embeddings, each block, the final norm.
        let units = layers + 2;
        assert_eq!(
            count("step "),
            trace_steps as usize,
            "{steps} steps: {names:?}"
        );
        assert_eq!(
            count("delayed update unit "),
            trace_steps as usize * units,
            "{steps} steps, {trace_steps} traced: every traced step's update, once per unit"
        );
    }
}
