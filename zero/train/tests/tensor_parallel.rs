//! `--tensor-parallel-size T`: the GPT's blocks split Megatron's way over groups of T ranks,
//! ZeRO over the world_size / T data-parallel ranks. A T = 2 run follows the T = 1 run of
//! the same global batch to rounding at every stage, every stage gives the same bits at
//! T = 2 (as at T = 1), and what does not run split yet is refused at start-up.

mod common;
use common::{learnable_corpus, TempDir};

use std::path::Path;
use zero::ZeroStage;
use zero_train::plan::plan_report::stage_plans;
use zero_train::{train, ByteSize, PrecisionArg, RunSummary, TrainConfig, TrainError};

/// The tiny GPT (2 heads) on 4 ranks: a global batch of 4 sequences, evaluation every 4
/// steps on the same 4 validation sequences at every T (an evaluation batch is one
/// sequence per data-parallel rank, so T batches of them), a closing sample; at T = 2 two
/// data-parallel ranks of 2 micro-batches each.
fn tiny(data: &Path, tp: usize, stage: ZeroStage) -> TrainConfig {
    TrainConfig {
        model: "tiny".into(),
        seq_len: 16,
        data: data.to_path_buf(),
        world_size: 4,
        tensor_parallel_size: tp,
        zero_stage: stage,
        steps: 10,
        batch_size: 4,
        micro_batch_size: 1,
        warmup_steps: 2,
        eval_every: 4,
        eval_batches: tp.max(1),
        sample_tokens: 5,
        lr: 1e-2,
        ..TrainConfig::default()
    }
}

fn bits(xs: &[f32]) -> Vec<u32> {
    xs.iter().map(|x| x.to_bits()).collect()
}

fn val_bits(run: &RunSummary) -> Vec<(u64, u32)> {
    run.val_losses
        .iter()
        .map(|&(s, l)| (s, l.to_bits()))
        .collect()
}

/// The largest relative difference between the losses (training and validation) of `a`
/// and `b`, which must have as many of each.
fn max_relative(a: &RunSummary, b: &RunSummary) -> f64 {
    assert_eq!(a.losses.len(), b.losses.len());
    assert_eq!(a.val_losses.len(), b.val_losses.len());
    let val = |r: &RunSummary| r.val_losses.iter().map(|v| v.1).collect::<Vec<_>>();
    let (va, vb) = (val(a), val(b));
    a.losses
        .iter()
        .zip(&b.losses)
        .chain(va.iter().zip(&vb))
        .map(|(&x, &y)| (f64::from(x) - f64::from(y)).abs() / f64::from(x).abs())
        .fold(0.0, f64::max)
}

#[test]
fn two_way_tensor_parallel_follows_the_unsplit_run_at_every_stage() {
    let dir = TempDir::new("tp-vs-dp");
    learnable_corpus(&dir.0);
    let mut worst = 0.0f64;
    for stage in ZeroStage::ALL {
        let whole = train(&tiny(&dir.0, 1, stage)).unwrap();
        let split = train(&tiny(&dir.0, 2, stage)).unwrap();
        // Training moved the model, so agreement means something.
        assert!(
            whole.losses[0] > whole.losses[7] + 0.1,
            "{:?}",
            whole.losses
        );
        let rel = max_relative(&whole, &split);
        eprintln!("{stage}: T=2 x DP=2 vs T=1 x DP=4, max relative difference {rel:e}");
        assert!(rel < 1e-6, "{stage}: {rel:e}");
        worst = worst.max(rel);
        // Each rank of a group holds its slices: the same parameter count in all.
        assert_eq!(whole.num_params, split.num_params);
        assert_eq!(whole.sample.len(), split.sample.len());
    }
    eprintln!("worst relative difference over stages 0-3: {worst:e}");
}

#[test]
fn bf16_at_two_way_follows_the_unsplit_bf16_run() {
    // bf16 rounds each split product's partial sums before the group adds them, so the
    // bound is bf16's: 2e-2 relative.
    let dir = TempDir::new("tp-vs-dp-bf16");
    learnable_corpus(&dir.0);
    for stage in [ZeroStage::Zero0, ZeroStage::Zero3] {
        let cfg = |tp| TrainConfig {
            precision: PrecisionArg::Bf16,
            ..tiny(&dir.0, tp, stage)
        };
        let whole = train(&cfg(1)).unwrap();
        let split = train(&cfg(2)).unwrap();
        assert!(
            whole.losses[0] > whole.losses[7] + 0.1,
            "{:?}",
            whole.losses
        );
        let rel = max_relative(&whole, &split);
        eprintln!("bf16 {stage}: T=2 x DP=2 vs T=1 x DP=4, max relative difference {rel:e}");
        assert!(rel < 2e-2, "{stage}: {rel:e}");
    }
}

#[test]
fn every_stage_gives_the_same_bits_at_two_way_tensor_parallelism() {
    let dir = TempDir::new("tp-stages");
    learnable_corpus(&dir.0);
    let reference = train(&tiny(&dir.0, 2, ZeroStage::Zero0)).unwrap();
    for stage in [ZeroStage::Zero1, ZeroStage::Zero2, ZeroStage::Zero3] {
        let run = train(&tiny(&dir.0, 2, stage)).unwrap();
        assert_eq!(bits(&run.losses), bits(&reference.losses), "{stage}");
        assert_eq!(val_bits(&run), val_bits(&reference), "{stage}");
        assert_eq!(run.sample, reference.sample, "{stage}");
    }
    // Every rank reports once, under its world rank.
    let ranks: Vec<usize> = reference.ranks.iter().map(|r| r.rank).collect();
    assert_eq!(ranks, [0, 1, 2, 3]);
}

#[test]
fn half_precisions_give_the_same_bits_at_every_stage_split() {
    let dir = TempDir::new("tp-precision");
    learnable_corpus(&dir.0);
    for precision in [PrecisionArg::Bf16, PrecisionArg::Fp16] {
        let cfg = |stage| TrainConfig {
            precision,
            ..tiny(&dir.0, 2, stage)
        };
        let reference = train(&cfg(ZeroStage::Zero0)).unwrap();
        assert!(reference.losses.iter().all(|l| l.is_finite()));
        for stage in [ZeroStage::Zero1, ZeroStage::Zero2, ZeroStage::Zero3] {
            let run = train(&cfg(stage)).unwrap();
            let what = format!("{precision:?} {stage}");
            assert_eq!(bits(&run.losses), bits(&reference.losses), "{what}");
            assert_eq!(val_bits(&run), val_bits(&reference), "{what}");
        }
    }
}

#[test]
fn checkpointed_blocks_recompute_the_same_bits_split() {
    let dir = TempDir::new("tp-checkpoint");
    learnable_corpus(&dir.0);
    let plain = train(&tiny(&dir.0, 2, ZeroStage::Zero3)).unwrap();
    for offload in [false, true] {
        let cfg = TrainConfig {
            activation_checkpointing: true,
            offload_activations: offload,
            ..tiny(&dir.0, 2, ZeroStage::Zero3)
        };
        let run = train(&cfg).unwrap();
        assert_eq!(bits(&run.losses), bits(&plain.losses), "offload {offload}");
    }
}

#[test]
fn four_way_tensor_parallel_splits_every_rank_into_one_group() {
    // T = world: one group, no data parallelism; the tiny model has 2 heads, so a model of
    // 4 heads.
    let dir = TempDir::new("tp-four");
    learnable_corpus(&dir.0);
    let four_heads = |tp| TrainConfig {
        heads: Some(4),
        ..tiny(&dir.0, tp, ZeroStage::Zero2)
    };
    let whole = train(&four_heads(1)).unwrap();
    let split = train(&four_heads(4)).unwrap();
    let rel = max_relative(&whole, &split);
    eprintln!("T=4 x DP=1 vs T=1 x DP=4: max relative difference {rel:e}");
    assert!(rel < 1e-6, "{rel:e}");
}

#[test]
fn each_stage_planned_at_two_way_tensor_parallelism_is_the_peak_a_run_measures() {
    let dir = TempDir::new("tp-plan");
    learnable_corpus(&dir.0);
    for every in [None, Some(1)] {
        // One step, no evaluation or sample; room under the cap, so no allocation has to
        // land collectives early (which would end the peak below the plan).
        let cfg = TrainConfig {
            steps: 1,
            eval_every: 0,
            sample_tokens: 0,
            memory_limit: Some(ByteSize(1 << 30)),
            activation_checkpointing: every.is_some(),
            checkpoint_every: every.unwrap_or(1),
            ..tiny(&dir.0, 2, ZeroStage::Zero0)
        };
        let (_, plans) = stage_plans(&cfg).unwrap();
        // The same data-parallel ranks, the blocks whole.
        let (_, whole) = stage_plans(&TrainConfig {
            tensor_parallel_size: 1,
            world_size: 2,
            ..cfg.clone()
        })
        .unwrap();
        for (p, w) in plans.iter().zip(&whole) {
            let run = train(&TrainConfig {
                zero_stage: p.stage,
                ..cfg.clone()
            })
            .unwrap();
            let what = format!("{} checkpointing {every:?}", p.stage);
            for rank in &run.ranks {
                assert_eq!(
                    rank.peak_bytes,
                    p.plan.total(),
                    "{what}, rank {}",
                    rank.rank
                );
            }
            // A rank of a group holds half the blocks' parameters, so less than a rank of
            // as many data-parallel ranks with the blocks whole.
            assert!(
                p.plan.model_states.total() < w.plan.model_states.total(),
                "{what}"
            );
            assert!(p.formula <= p.plan.model_states.total(), "{what}");
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
fn sizes_that_do_not_divide_are_refused_naming_the_flag_and_a_size_that_fits() {
    let dir = TempDir::new("tp-sizes");
    learnable_corpus(&dir.0);
    let world = TrainConfig {
        world_size: 6,
        batch_size: 6,
        ..tiny(&dir.0, 4, ZeroStage::Zero2)
    };
    let text = refusal(&world);
    assert!(
        text.contains("--tensor-parallel-size 4") && text.contains("e.g. 3"),
        "{text}"
    );
    // 2 divides the 4 ranks but not the 3 heads.
    let heads = TrainConfig {
        heads: Some(3),
        dim: Some(48),
        ..tiny(&dir.0, 2, ZeroStage::Zero2)
    };
    let text = refusal(&heads);
    assert!(
        text.contains("--tensor-parallel-size 2") && text.contains("3 heads"),
        "{text}"
    );
    let zero = tiny(&dir.0, 0, ZeroStage::Zero2);
    assert!(refusal(&zero).contains("--tensor-parallel-size 0"));
    // The global batch divides among the data-parallel ranks, not the world's.
    let batch = TrainConfig {
        batch_size: 3,
        ..tiny(&dir.0, 2, ZeroStage::Zero2)
    };
    let text = refusal(&batch);
    assert!(
        text.contains("--batch-size 3") && text.contains("data-parallel ranks 2"),
        "{text}"
    );
}

#[test]
fn features_that_do_not_run_split_yet_are_refused_at_start_up() {
    let dir = TempDir::new("tp-refusals");
    learnable_corpus(&dir.0);
    let base = tiny(&dir.0, 2, ZeroStage::Zero2);
    let cases: Vec<(&str, TrainConfig)> = vec![
        (
            "--device cuda",
            TrainConfig {
                device: "cuda".parse().unwrap(),
                ..base.clone()
            },
        ),
        (
            "--offload-optimizer",
            TrainConfig {
                offload_optimizer: zero_train::OffloadTier::Cpu,
                ..base.clone()
            },
        ),
        (
            "--inject-fault",
            TrainConfig {
                inject_fault: vec!["diverge:rank=0,step=1".parse().unwrap()],
                ..base.clone()
            },
        ),
        (
            "--fingerprint-every",
            TrainConfig {
                fingerprint_every: 2,
                ..base.clone()
            },
        ),
    ];
    for (flag, cfg) in cases {
        let text = refusal(&cfg);
        assert!(
            text.contains(flag) && text.contains("--tensor-parallel-size 2"),
            "{flag}: {text}"
        );
    }
}

#[test]
fn the_flag_and_the_config_key_reach_the_run() {
    let dir = TempDir::new("tp-cli");
    learnable_corpus(&dir.0);
    let toml = dir.0.join("run.toml");
    std::fs::write(&toml, "tensor_parallel_size = 3\n").unwrap();
    let data = dir.0.display().to_string();
    let run = |extra: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_zero-train"))
            .args(["--model", "tiny", "--seq-len", "16", "--world-size", "4"])
            .args(["--steps", "1", "--sample-tokens", "0", "--data", &data])
            .args(extra)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (ok, err) = run(&["--config", toml.to_str().unwrap()]);
    assert!(
        !ok && err.contains("`tensor_parallel_size` in --config"),
        "{err}"
    );
    assert!(err.contains("e.g. 2"), "{err}");
    // The flag over the file; the global batch left out is one micro-batch per
    // data-parallel rank.
    let (ok, err) = run(&[
        "--config",
        toml.to_str().unwrap(),
        "--tensor-parallel-size",
        "2",
    ]);
    assert!(ok, "{err}");
    assert!(
        err.contains("4 ranks in tensor-parallel groups of 2 | global batch 8 x 16"),
        "{err}"
    );
}
