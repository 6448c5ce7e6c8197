//! `--partition-activations` (ZeRO-R's P_a) at T = 2 x DP = 2: each rank of a
//! tensor-parallel group keeps half of each checkpointed block input, all-gathered before
//! the block's recompute. The losses equal those of whole kept inputs to the bit (in the
//! arena and offloaded), the kept inputs' arena bytes fall below 0.6x those at T = 1, the
//! plan stays the measured peak, and the flag without checkpointing or at T = 1 is refused.

mod common;
use common::{learnable_corpus, TempDir};

use std::path::Path;
use zero::ZeroStage;
use zero_train::plan::plan_report::stage_plans;
use zero_train::{train, ByteSize, TrainConfig, TrainError};

/// The tiny GPT (2 heads) with `layers` blocks on 4 ranks in groups of `tp`, checkpointing
/// every block: a global batch of 4 sequences of 16, 3 steps, nothing else.
fn checkpointed(data: &Path, tp: usize, layers: usize) -> TrainConfig {
    TrainConfig {
        model: "tiny".into(),
        layers: Some(layers),
        seq_len: 16,
        data: data.to_path_buf(),
        world_size: 4,
        tensor_parallel_size: tp,
        steps: 3,
        batch_size: 4,
        micro_batch_size: 1,
        warmup_steps: 1,
        eval_every: 0,
        sample_tokens: 0,
        lr: 1e-2,
        activation_checkpointing: true,
        ..TrainConfig::default()
    }
}

fn bits(xs: &[f32]) -> Vec<u32> {
    xs.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn partitioned_kept_inputs_give_the_losses_of_whole_ones_to_the_bit() {
    let dir = TempDir::new("pa-bits");
    learnable_corpus(&dir.0);
    for stage in [ZeroStage::Zero0, ZeroStage::Zero3] {
        for offload in [false, true] {
            let whole = TrainConfig {
                zero_stage: stage,
                offload_activations: offload,
                ..checkpointed(&dir.0, 2, 4)
            };
            let split = TrainConfig {
                partition_activations: true,
                ..whole.clone()
            };
            let (a, b) = (train(&whole).unwrap(), train(&split).unwrap());
            let what = format!("{stage}, offload {offload}");
            assert!(a.losses.iter().all(|l| l.is_finite()), "{what}");
            assert_eq!(bits(&a.losses), bits(&b.losses), "{what}");
            // The partitioned run did keep slices: fewer kept bytes on every rank (offloaded,
            // on the host).
            for (x, y) in a.ranks.iter().zip(&b.ranks) {
                let kept = |r: &zero_train::run::metrics::RankReport| match offload {
                    true => r.activation_offloaded_bytes,
                    false => r.activation_kept_bytes,
                };
                assert!(kept(y) < kept(x), "{what}, rank {}", x.rank);
            }
        }
    }
}

#[test]
fn a_rank_keeps_under_six_tenths_of_the_unsplit_kept_inputs() {
    // 16 blocks, 15 kept inputs of (16 x 32) f32 = 2 KiB each. At T = 1 every rank keeps
    // them whole: 30 KiB. At T = 2 with P_a each keeps a 1 KiB slice of each and one 2 KiB
    // buffer to gather into: 17 KiB, 0.57x.
    let dir = TempDir::new("pa-bytes");
    learnable_corpus(&dir.0);
    let one_step = |tp, partition_activations| TrainConfig {
        steps: 1,
        partition_activations,
        ..checkpointed(&dir.0, tp, 16)
    };
    let whole = train(&one_step(1, false)).unwrap();
    let split = train(&one_step(2, true)).unwrap();
    let kept = |run: &zero_train::RunSummary| {
        let bytes: Vec<u64> = run.ranks.iter().map(|r| r.activation_kept_bytes).collect();
        assert!(bytes.iter().all(|&b| b == bytes[0]), "{bytes:?}");
        bytes[0]
    };
    let (t1, t2) = (kept(&whole), kept(&split));
    eprintln!(
        "kept-input arena bytes per rank: T=1 {t1}, T=2 with P_a {t2} ({:.3}x); activation \
         bytes in all: T=1 {}, T=2 {}",
        t2 as f64 / t1 as f64,
        whole.ranks[0].activation_bytes,
        split.ranks[0].activation_bytes,
    );
    assert_eq!(t1, 15 * 2048);
    assert_eq!(t2, 15 * 1024 + 2048);
    assert!(t2 as f64 <= 0.6 * t1 as f64, "{t2} vs {t1}");
}

#[test]
fn the_plan_with_partitioned_inputs_is_the_peak_a_run_measures() {
    let dir = TempDir::new("pa-plan");
    learnable_corpus(&dir.0);
    for offload in [false, true] {
        // One step; room under the cap, so no allocation has to land collectives early.
        let cfg = TrainConfig {
            steps: 1,
            memory_limit: Some(ByteSize(1 << 30)),
            offload_activations: offload,
            partition_activations: true,
            ..checkpointed(&dir.0, 2, 4)
        };
        let (_, plans) = stage_plans(&cfg).unwrap();
        let (_, unpartitioned) = stage_plans(&TrainConfig {
            partition_activations: false,
            ..cfg.clone()
        })
        .unwrap();
        for (p, w) in plans.iter().zip(&unpartitioned) {
            let run = train(&TrainConfig {
                zero_stage: p.stage,
                ..cfg.clone()
            })
            .unwrap();
            let what = format!("{}, offload {offload}", p.stage);
            for rank in &run.ranks {
                assert_eq!(
                    rank.peak_bytes,
                    p.plan.total(),
                    "{what}, rank {}",
                    rank.rank
                );
                let kept = (rank.activation_kept_bytes, rank.activation_offloaded_bytes);
                assert_eq!(
                    kept,
                    (p.plan.kept_inputs, p.plan.kept_inputs_host),
                    "{what}"
                );
            }
            // 3 kept inputs of 2 KiB: slices of 1 KiB and one 2 KiB buffer in the arena, or
            // offloaded, the buffer in the arena (in place of two 2 KiB staging slots) and
            // the slices on the host.
            let want = match offload {
                false => ((3 * 1024 + 2048), 0, 3 * 2048),
                true => (2048, 3 * 1024, 2 * 2048),
            };
            let got = (
                p.plan.kept_inputs,
                p.plan.kept_inputs_host,
                w.plan.kept_inputs,
            );
            assert_eq!(got, want, "{what}");
        }
    }
}

/// The start-up error of `cfg`, as text.
fn refusal(cfg: &TrainConfig) -> String {
    match train(cfg) {
        Err(e @ TrainError::Config(_)) => e.to_string(),
        other => panic!("expected a configuration error, got {other:?}"),
    }
}

#[test]
fn the_flag_without_checkpointing_or_a_group_is_refused_naming_what_works() {
    let dir = TempDir::new("pa-refusals");
    learnable_corpus(&dir.0);
    let unchecked = TrainConfig {
        activation_checkpointing: false,
        partition_activations: true,
        ..checkpointed(&dir.0, 2, 2)
    };
    let text = refusal(&unchecked);
    assert!(
        text.contains("--partition-activations") && text.contains("--activation-checkpointing"),
        "{text}"
    );
    let alone = TrainConfig {
        partition_activations: true,
        ..checkpointed(&dir.0, 1, 2)
    };
    let text = refusal(&alone);
    assert!(
        text.contains("--partition-activations")
            && text.contains("--tensor-parallel-size 1")
            && text.contains("--tensor-parallel-size 2 or more"),
        "{text}"
    );
    // `zero-train plan` refuses it alike.
    assert!(stage_plans(&alone).is_err());
}

#[test]
fn the_flag_and_the_config_key_reach_the_plan() {
    let dir = TempDir::new("pa-cli");
    let toml = dir.0.join("run.toml");
    std::fs::write(&toml, "partition_activations = true\n").unwrap();
    let plan = |extra: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_zero-train"))
            .args([
                "plan",
                "--model",
                "tiny",
                "--seq-len",
                "16",
                "--world-size",
                "4",
            ])
            .args(["--activation-checkpointing", "--tensor-parallel-size", "2"])
            .args(extra)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        (
            out.status.success(),
            text + &String::from_utf8_lossy(&out.stderr),
        )
    };
    for extra in [
        &["--partition-activations"][..],
        &["--config", toml.to_str().unwrap()],
    ] {
        let (ok, text) = plan(extra);
        assert!(ok && text.contains("inputs partitioned over 2"), "{text}");
    }
    let (ok, text) = plan(&[]);
    assert!(ok && !text.contains("partitioned"), "{text}");
}

/// `--trace` draws each gather of a kept input's slices on the collectives' track, from its
/// launch (the fetch, one restore ahead) until it was waited for: one per restored input per
/// micro-step, each spanning model operations that ran while it was in flight.
#[test]
fn the_timeline_draws_each_gather_over_the_operations_it_overlaps() {
    let dir = TempDir::new("pa-trace");
    learnable_corpus(&dir.0);
    let path = dir.0.join("timeline.json");
    let cfg = TrainConfig {
        partition_activations: true,
        trace: Some(path.clone()),
        trace_steps: 2,
        ..checkpointed(&dir.0, 2, 3)
    };
    train(&cfg).unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let events = doc["traceEvents"].as_array().unwrap();
    let gather = |e: &&serde_json::Value| {
        e["name"]
            .as_str()
            .is_some_and(|n| n.starts_with("all-gather of kept input"))
    };
    // 2 traced steps x 2 micro-steps (2 sequences per data-parallel rank, micro-batch 1);
    // 3 blocks checkpointed one by one: 2 recomputed segments restore an input each.
    let expected = 2 * 2 * 2;
    for rank in 0..4 {
        let of_rank = |ph: &str| -> Vec<&serde_json::Value> {
            events
                .iter()
                .filter(|e| e["pid"] == rank && e["ph"] == ph)
                .filter(gather)
                .collect()
        };
        let (begins, ends) = (of_rank("b"), of_rank("e"));
        assert_eq!(begins.len(), expected, "rank {rank}: gathers begun");
        assert_eq!(ends.len(), expected, "rank {rank}: gathers ended");
        for b in &begins {
            let end = ends
                .iter()
                .find(|e| e["id"] == b["id"])
                .expect("each gather ends");
            let (from, to) = (b["ts"].as_f64().unwrap(), end["ts"].as_f64().unwrap());
            let overlapped = events.iter().any(|e| {
                e["pid"] == rank && e["tid"] == 1 && e["ph"] == "X" && {
                    let t = e["ts"].as_f64().unwrap();
                    from < t && t < to
                }
            });
            assert!(
                overlapped,
                "rank {rank}: {} overlaps no operation",
                b["name"]
            );
        }
    }
}
