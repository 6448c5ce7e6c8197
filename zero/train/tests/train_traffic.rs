//! `zero-train plan`'s traffic per step is what a run counts: the plan replays the GPT's
//! schedule against the engine's collective rules (`zero::plan_traffic`), the run counts the
//! elements the engine hands to each collective as it runs them (`Engine::traffic`) and the
//! bytes zero-comm records; the two share no counting code.

mod common;
use common::{write_corpus, TempDir};
use std::path::Path;
use zero::ZeroStage;
use zero_gpt::Rng;
use zero_train::plan::plan_report::stage_plans;
use zero_train::{train, PrecisionArg, TrainConfig};

fn corpus(dir: &Path) {
    let mut rng = Rng::new(7);
    let tokens: Vec<u16> = (0..4_000).map(|_| (rng.next_u64() % 100) as u16).collect();
    write_corpus(dir, &tokens, 1_000, 100);
}

/// The tiny preset, two steps (the second shows that a step's count does not depend on
/// the first step's start-up collectives).
fn tiny(data: &Path, world: usize, accum: usize) -> TrainConfig {
    TrainConfig {
        model: "tiny".into(),
        seq_len: 16,
        data: data.to_path_buf(),
        world_size: world,
        steps: 2,
        batch_size: world * accum,
        micro_batch_size: 1,
        eval_every: 0,
        sample_tokens: 0,
        ..TrainConfig::default()
    }
}

/// Trains `cfg` at every stage and checks every rank's traffic per step against the plan:
/// elements exactly, bytes sent and received as the plan's ring bytes plus the control
/// collectives (the loss, the norm's partial sums, the overflow flag: under 1 KiB).
fn plan_equals_run(cfg: &TrainConfig) {
    for stage in ZeroStage::ALL {
        let cfg = TrainConfig {
            zero_stage: stage,
            ..cfg.clone()
        };
        let (_, plans) = stage_plans(&cfg).unwrap();
        let plan = plans.iter().find(|p| p.stage == stage).unwrap();
        let dtype = zero::Precision::from(cfg.precision).dtype();
        let (sent, received) = plan.traffic.ring_bytes(cfg.world_size, dtype);
        let run = train(&cfg).unwrap();
        assert_eq!(run.ranks.len(), cfg.world_size);
        for r in &run.ranks {
            let what = format!("{stage}, {:?}, rank {}", cfg.precision, r.rank);
            assert_eq!(r.traffic_per_step, plan.traffic, "{what}");
            let (s, v) = (r.comm_bytes_sent_per_step, r.comm_bytes_received_per_step);
            assert!(
                s >= sent as f64 && s <= sent as f64 + 1024.0,
                "{what}: sent {s} vs {sent}"
            );
            assert!(
                v >= received as f64 && v <= received as f64 + 1024.0,
                "{what}: received {v} vs {received}"
            );
        }
    }
}

#[test]
fn planned_traffic_is_the_runs_at_every_stage_and_precision() {
    let dir = TempDir::new("traffic-precision");
    corpus(&dir.0);
    for precision in [PrecisionArg::Fp32, PrecisionArg::Bf16] {
        plan_equals_run(&TrainConfig {
            precision,
            ..tiny(&dir.0, 2, 1)
        });
    }
}

#[test]
fn planned_traffic_counts_every_micro_step_and_rank_count() {
    let dir = TempDir::new("traffic-accum");
    corpus(&dir.0);
    plan_equals_run(&tiny(&dir.0, 3, 2));
}

#[test]
fn planned_traffic_follows_checkpointing_and_prefetch() {
    let dir = TempDir::new("traffic-options");
    corpus(&dir.0);
    // Recompute gathers a checkpointed segment's units again at stage 3.
    plan_equals_run(&TrainConfig {
        activation_checkpointing: true,
        ..tiny(&dir.0, 2, 1)
    });
    plan_equals_run(&TrainConfig {
        prefetch_units: 0,
        ..tiny(&dir.0, 2, 1)
    });
}

#[test]
fn stage_three_plans_more_traffic_than_stage_zero_and_the_same_for_stages_one_two() {
    let dir = TempDir::new("traffic-order");
    corpus(&dir.0);
    let (_, plans) = stage_plans(&tiny(&dir.0, 4, 1)).unwrap();
    let e: Vec<u64> = plans.iter().map(|p| p.traffic.elements()).collect();
    assert_eq!(e[1], e[2]);
    assert!(e[3] > e[1] && e[3] < 2 * e[1], "{e:?}");
}

/// `zero-train plan` with the tiny preset on 2 ranks and `extra` flags: (success, stdout,
/// stderr).
fn plan(extra: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_zero-train"))
        .args(["plan", "--model", "tiny", "--seq-len", "16"])
        .args(["--world-size", "2", "--micro-batch-size", "1"])
        .args(extra)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[test]
fn the_plan_prices_each_stages_bytes_at_the_link_rate() {
    let (ok, text, err) = plan(&["--link-rate", "250mbit"]);
    assert!(ok, "{text}{err}");
    let table = text
        .split("communication per step at --link-rate 250 Mbit/s")
        .nth(1)
        .unwrap_or_else(|| panic!("no link table in {text}"));
    let rows: Vec<Vec<&str>> = table
        .lines()
        .filter(|l| l.starts_with(|c: char| c.is_ascii_digit()))
        .map(|l| l.split(" | ").collect())
        .collect();
    assert_eq!(rows.len(), 4, "{table}");
    for row in rows {
        // "12.34 KiB" sent at 250e6 bit/s, against the printed "x.y ms".
        let (value, unit) = row[2].split_once(' ').unwrap();
        let scale = match unit {
            "KiB" => 1024.0,
            "MiB" => 1024.0 * 1024.0,
            other => panic!("unit {other} in {row:?}"),
        };
        let bytes: f64 = value.parse::<f64>().unwrap() * scale;
        let ms: f64 = row[4].split(' ').next().unwrap().parse().unwrap();
        let want = bytes * 8.0 / 250e6 * 1e3;
        assert!(
            (ms - want).abs() <= 0.06 + want * 0.01,
            "{row:?}: want {want} ms"
        );
    }
}

#[test]
fn a_link_rate_that_cannot_be_parsed_is_refused_by_name() {
    for bad in ["fast", "1e9bit", "-1gbit", "0mbit"] {
        // `=`: clap would read "-1gbit" as a flag of its own.
        let (ok, text, err) = plan(&[&format!("--link-rate={bad}")]);
        assert!(!ok && text.is_empty(), "{bad}: {text}");
        assert!(
            err.contains("--link-rate") && err.contains("invalid link rate"),
            "{bad}: {err}"
        );
    }
}
