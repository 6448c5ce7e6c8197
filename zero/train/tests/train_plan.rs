//! `zero-train plan`: every stage's plan for a run's flags, which is what a run with those
//! flags then allocates: each stage's planned bytes equal the peak the trainer measures (with
//! room to spare under the cap), and the offloaded optimizer's host arena its planned size.

mod common;
use common::{write_corpus, TempDir};
use std::path::Path;
use std::process::Command;
use zero::ZeroStage;
use zero_gpt::Rng;
use zero_train::plan::plan_report::stage_plans;
use zero_train::{train, ByteSize, OffloadTier, PrecisionArg, TrainConfig};

fn corpus(dir: &Path) {
    let mut rng = Rng::new(4);
    let tokens: Vec<u16> = (0..4_000).map(|_| (rng.next_u64() % 100) as u16).collect();
    write_corpus(dir, &tokens, 1_000, 100);
}

/// The tiny preset on 2 ranks, one step, with room under the cap so no allocation has to land
/// collectives early (which would end the peak below the plan).
fn tiny(data: &Path, stage: ZeroStage) -> TrainConfig {
    TrainConfig {
        model: "tiny".into(),
        seq_len: 16,
        data: data.to_path_buf(),
        world_size: 2,
        steps: 1,
        batch_size: 2,
        micro_batch_size: 1,
        eval_every: 0,
        sample_tokens: 0,
        zero_stage: stage,
        memory_limit: Some(ByteSize(1 << 30)),
        ..TrainConfig::default()
    }
}

#[test]
fn each_stage_planned_is_the_peak_a_run_measures() {
    let dir = TempDir::new("plan");
    corpus(&dir.0);
    let nvme = dir.0.join("nvme");
    std::fs::create_dir(&nvme).unwrap();
    for tier in [OffloadTier::Off, OffloadTier::Cpu, OffloadTier::Nvme] {
        for precision in [PrecisionArg::Fp32, PrecisionArg::Bf16] {
            let cfg = TrainConfig {
                offload_optimizer: tier,
                nvme_path: (tier == OffloadTier::Nvme).then(|| nvme.clone()),
                precision,
                ..tiny(&dir.0, ZeroStage::Zero0)
            };
            let (_, plans) = stage_plans(&cfg).unwrap();
            for p in plans {
                let run = train(&TrainConfig {
                    zero_stage: p.stage,
                    ..cfg.clone()
                })
                .unwrap();
                let what = format!("{:?} {} offload {tier:?}", precision, p.stage);
                let rank0 = &run.ranks[0];
                assert_eq!(rank0.peak_bytes, p.plan.total(), "{what}");
                let host = p.plan.offload.map_or(0, |o| o.total());
                assert_eq!(rank0.optimizer_offloaded_bytes, host, "{what}");
                // The file measured on disk is the planned one, and there is one only with
                // the file tier.
                let file = p.plan.offload.map_or(0, |o| o.file);
                assert_eq!(rank0.optimizer_file_bytes, file, "{what}");
                assert_eq!(file > 0, tier == OffloadTier::Nvme, "{what}");
                // The paper's formula (unpadded) is at most the padded model states planned,
                // the offloaded ones included (in the file: its slots hold them).
                let offloaded = p.plan.offload.map_or(0, |o| o.states.max(o.file)) as f64;
                assert!(
                    p.formula <= p.plan.model_states.total() + offloaded,
                    "{what}"
                );
            }
        }
    }
}

#[test]
fn the_plan_command_prints_every_stage_and_marks_the_one_asked() {
    let out = Command::new(env!("CARGO_BIN_EXE_zero-train"))
        .args([
            "plan",
            "--model",
            "gpt2-xl",
            "--world-size",
            "64",
            "--zero-stage",
            "3",
        ])
        .args(["--precision", "bf16", "--offload-optimizer"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("1557.69M parameters | 64 ranks | bf16"),
        "{text}"
    );
    let rows: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with(|c: char| c.is_ascii_digit()))
        .collect();
    assert_eq!(rows.len(), 4, "{text}");
    for (stage, row) in rows.iter().enumerate() {
        assert!(row.starts_with(&format!("{stage} | ")), "{row}");
        assert_eq!(row.ends_with("<- asked"), stage == 3, "{row}");
    }
    // Offloaded: no optimizer bytes in the arena, a host arena per rank.
    assert!(
        rows.iter().all(|r| r.split(" | ").nth(3) == Some("0 B")),
        "{text}"
    );
    assert!(
        rows.iter().all(|r| r.split(" | ").nth(7) != Some("-")),
        "{text}"
    );
    // In the host arena, not in files.
    assert!(
        rows.iter().all(|r| r.split(" | ").nth(8) == Some("-")),
        "{text}"
    );
}

#[test]
fn the_plan_prints_each_stages_file_bytes_with_the_file_tier() {
    let dir = TempDir::new("plan-nvme");
    let nvme = dir.0.to_str().unwrap();
    let (ok, text, err) = plan_tiny(&["--offload-optimizer", "nvme", "--nvme-path", nvme]);
    assert!(ok, "{err}");
    assert!(text.contains("optimizer offloaded to files"), "{text}");
    let cfg = TrainConfig {
        offload_optimizer: OffloadTier::Nvme,
        nvme_path: Some(dir.0.clone()),
        ..tiny(&dir.0, ZeroStage::Zero2)
    };
    let (_, plans) = stage_plans(&cfg).unwrap();
    let rows: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with(|c: char| c.is_ascii_digit()))
        .collect();
    assert_eq!(rows.len(), 4, "{text}");
    for (row, p) in rows.iter().zip(&plans) {
        let o = p.plan.offload.unwrap();
        assert!(o.file > 0 && o.states == 0, "{row}");
        let cells: Vec<&str> = row.split(" | ").collect();
        assert_eq!(cells[7], zero_alloc::human_bytes(o.total()), "{row}");
        assert_eq!(cells[8], zero_alloc::human_bytes(o.file), "{row}");
    }
}

#[test]
fn a_bad_flag_is_refused_by_name_without_a_plan() {
    let out = Command::new(env!("CARGO_BIN_EXE_zero-train"))
        .args(["plan", "--world-size", "0"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("--world-size"),
        "{err}"
    );
}

/// `zero-train plan` with the tiny preset on 2 ranks and `extra` flags: (success, stdout,
/// stderr).
fn plan_tiny(extra: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_zero-train"))
        .args([
            "plan",
            "--model",
            "tiny",
            "--seq-len",
            "16",
            "--world-size",
            "2",
        ])
        .args(["--micro-batch-size", "1"])
        .args(extra)
        .output()
        .unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).to_string();
    (out.status.success(), text(&out.stdout), text(&out.stderr))
}

#[test]
fn a_batch_size_training_refuses_is_refused_by_the_plan_too() {
    let (ok, _, err) = plan_tiny(&["--batch-size", "3"]);
    assert!(!ok && err.contains("--batch-size 3"), "{err}");
    let (ok, text, err) = plan_tiny(&["--batch-size", "4"]);
    assert!(ok, "{err}");
    assert!(text.contains("<- asked"), "{text}");
}

#[test]
fn under_a_memory_limit_each_stage_says_whether_it_fits() {
    // Stage 2's planned bytes (equal to the peak a run measures, above) as the limit: stage 2
    // fits to the byte, one byte less and it does not.
    let dir = TempDir::new("plan-limit");
    let (_, plans) = stage_plans(&tiny(&dir.0, ZeroStage::Zero2)).unwrap();
    let totals: Vec<u64> = plans.iter().map(|p| p.plan.total()).collect();
    for (limit, stage2_fits) in [(totals[2], true), (totals[2] - 1, false)] {
        let (ok, text, err) = plan_tiny(&["--memory-limit", &limit.to_string()]);
        assert!(ok, "{err}");
        let rows: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with(|c: char| c.is_ascii_digit()))
            .collect();
        assert_eq!(rows.len(), 4, "{text}");
        for (row, &total) in rows.iter().zip(&totals) {
            let fits = row.split(" | ").nth(10).unwrap_or("");
            assert_eq!(fits.starts_with("yes"), total <= limit, "{row}");
            assert_eq!(fits.starts_with("no, "), total > limit, "{row}");
        }
        let stage2 = rows[2].split(" | ").nth(10).unwrap_or("");
        assert_eq!(stage2.starts_with("yes"), stage2_fits, "{text}");
    }
}

#[test]
fn a_flag_given_twice_takes_its_last_value() {
    // plan_tiny gives --world-size 2; the later 4 wins, as in argparse and torchrun.
    let (ok, stdout, stderr) = plan_tiny(&["--world-size", "4", "--batch-size", "4"]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("| 4 ranks |"), "{stdout}");
    // Typed twice, the value still counts as typed: the default global batch does not apply.
    let (ok, _, stderr) = plan_tiny(&["--world-size", "4", "--batch-size", "3"]);
    assert!(!ok && stderr.contains("batch"), "{stderr}");
}
