//! `--offload-optimizer nvme` through `zero-train`: the same losses to the bit as
//! `--offload-optimizer cpu` and as no offload at every stage, fp32 and bf16, with pieces
//! small enough that each unit streams several; the summary names the file; and bad input
//! (no `--nvme-path`, a missing, non-directory or unwritable one, a host cap below one
//! piece, an `--nvme-path` or `--host-memory-limit` without what they configure) is refused
//! at start-up naming the flag, the path and the bytes.

mod common;
use common::{stderr, write_corpus, TempDir};
use std::path::Path;
use std::process::Command;
use zero::ZeroStage;
use zero_gpt::Rng;
use zero_train::plan::plan_report::stage_plans;
use zero_train::{train, ByteSize, OffloadTier, PrecisionArg, TrainConfig};

/// train.bin and val.bin of random tokens below 100.
fn corpus(dir: &Path) {
    let mut rng = Rng::new(5);
    let tokens: Vec<u16> = (0..6_000).map(|_| (rng.next_u64() % 100) as u16).collect();
    write_corpus(dir, &tokens, 2_000, 100);
}

/// The tiny preset, 2 layers, on 2 ranks for 3 steps in 1 KiB gradient buckets (optimizer
/// pieces of 256 or 512 elements).
fn tiny(data: &Path, stage: ZeroStage, precision: PrecisionArg, tier: OffloadTier) -> TrainConfig {
    TrainConfig {
        model: "tiny".into(),
        layers: Some(2),
        seq_len: 16,
        data: data.to_path_buf(),
        world_size: 2,
        steps: 3,
        batch_size: 2,
        micro_batch_size: 1,
        eval_every: 0,
        sample_tokens: 0,
        zero_stage: stage,
        precision,
        reduce_bucket_size: ByteSize(1024),
        offload_optimizer: tier,
        nvme_path: (tier == OffloadTier::Nvme).then(|| data.join("nvme")),
        ..TrainConfig::default()
    }
}

#[test]
fn the_file_tier_trains_the_losses_of_the_host_and_of_no_offload_to_the_bit() {
    let dir = TempDir::new("nvme-bits");
    corpus(&dir.0);
    std::fs::create_dir(dir.0.join("nvme")).unwrap();
    let bits = |l: &[f32]| l.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for precision in [PrecisionArg::Fp32, PrecisionArg::Bf16] {
        for stage in ZeroStage::ALL {
            let run = |tier| train(&tiny(&dir.0, stage, precision, tier)).unwrap();
            let plain = run(OffloadTier::Off);
            let what = format!("{precision:?} {stage}");
            assert_ne!(plain.losses[0], plain.losses[2], "{what}: nothing trained");
            assert_eq!(
                bits(&run(OffloadTier::Cpu).losses),
                bits(&plain.losses),
                "{what}"
            );
            let nvme = run(OffloadTier::Nvme);
            assert_eq!(bits(&nvme.losses), bits(&plain.losses), "{what}");
            assert!(
                nvme.ranks.iter().all(|r| r.optimizer_file_bytes > 0),
                "{what}"
            );
        }
    }
}

/// `zero-train` on the tiny preset, 2 ranks, 1 step, on the corpus in `data`, with `flags`.
fn tiny_run(data: &Path, flags: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_zero-train"))
        .args([
            "--model",
            "tiny",
            "--layers",
            "2",
            "--seq-len",
            "16",
            "--steps",
            "1",
        ])
        .args([
            "--world-size",
            "2",
            "--micro-batch-size",
            "1",
            "--eval-every",
            "0",
        ])
        .args(["--sample-tokens", "0", "--data", data.to_str().unwrap()])
        .args(flags)
        .output()
        .unwrap()
}

/// [`tiny_run`]: (success, stderr).
fn zero_train(data: &Path, flags: &[&str]) -> (bool, String) {
    let out = tiny_run(data, flags);
    (out.status.success(), stderr(&out))
}

#[test]
fn a_run_with_the_file_tier_names_its_file_in_the_summary() {
    let dir = TempDir::new("nvme-summary");
    corpus(&dir.0);
    let nvme = dir.0.join("nvme");
    std::fs::create_dir(&nvme).unwrap();
    let flags = [
        "--offload-optimizer",
        "nvme",
        "--nvme-path",
        nvme.to_str().unwrap(),
    ];
    let out = tiny_run(&dir.0, &flags);
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &stderr(&out);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("in its file (--offload-optimizer nvme"),
        "{text}"
    );
    assert_eq!(
        std::fs::read_dir(&nvme).unwrap().count(),
        0,
        "files left behind"
    );
}

#[test]
fn a_missing_unusable_or_unwritable_nvme_path_is_refused_naming_it() {
    let dir = TempDir::new("nvme-paths");
    corpus(&dir.0);
    let (ok, err) = zero_train(&dir.0, &["--offload-optimizer", "nvme"]);
    assert!(!ok && err.contains("--nvme-path DIR"), "{err}");
    let missing = dir.0.join("absent");
    let file = dir.0.join("train.bin");
    let under_file = file.join("sub");
    for (path, why) in [
        (&missing, "is not a directory one can use"),
        (&file, "is not a directory"),
        (&under_file, "is not a directory one can use"),
    ] {
        let path = path.to_str().unwrap();
        let (ok, err) = zero_train(
            &dir.0,
            &["--offload-optimizer", "nvme", "--nvme-path", path],
        );
        assert!(!ok, "{path}");
        assert!(err.contains(&format!("--nvme-path {path}: {why}")), "{err}");
    }
    // A read-only folder: refused where permissions bite (not for root, which the path
    // under a regular file above covers).
    use std::os::unix::fs::PermissionsExt;
    let read_only = dir.0.join("read-only");
    std::fs::create_dir(&read_only).unwrap();
    std::fs::set_permissions(&read_only, std::fs::Permissions::from_mode(0o555)).unwrap();
    if std::fs::File::create(read_only.join("probe")).is_err() {
        let path = read_only.to_str().unwrap();
        let (ok, err) = zero_train(
            &dir.0,
            &["--offload-optimizer", "nvme", "--nvme-path", path],
        );
        assert!(
            !ok && err.contains(&format!("--nvme-path {path}: cannot create")),
            "{err}"
        );
    }
    std::fs::set_permissions(&read_only, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (ok, err) = zero_train(&dir.0, &["--nvme-path", dir.0.to_str().unwrap()]);
    assert!(
        !ok && err.contains("give --offload-optimizer nvme"),
        "{err}"
    );
    let (ok, err) = zero_train(&dir.0, &["--host-memory-limit", "1M"]);
    assert!(!ok && err.contains("--host-memory-limit caps"), "{err}");
}

#[test]
fn a_host_cap_below_one_piece_is_refused_with_the_bytes_needed() {
    let dir = TempDir::new("nvme-cap");
    corpus(&dir.0);
    let nvme = dir.0.join("nvme");
    std::fs::create_dir(&nvme).unwrap();
    let cfg = tiny(
        &dir.0,
        ZeroStage::Zero2,
        PrecisionArg::Fp32,
        OffloadTier::Nvme,
    );
    let (_, plans) = stage_plans(&cfg).unwrap();
    let plan = plans[2].plan.offload.unwrap();
    let run = |limit: u64| {
        train(&TrainConfig {
            host_memory_limit: Some(ByteSize(limit)),
            steps: 1,
            ..cfg.clone()
        })
    };
    assert!(run(plan.staging).is_ok());
    let err = run(plan.staging - 1).unwrap_err().to_string();
    assert!(err.contains("--host-memory-limit"), "{err}");
    assert!(
        err.contains(&format!("needs {} bytes", plan.staging)),
        "{err}"
    );
}
