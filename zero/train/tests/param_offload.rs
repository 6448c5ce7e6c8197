//! `--offload-params` through `zero-train`: stage 3 with the parameter shards in host memory
//! or in files trains the losses of shards on the device to the bit, fp32 and bf16, with
//! and without activation checkpointing; each tier holds exactly what `zero-train plan`
//! says; a checkpoint saved with the shards in files resumes without offload to the bit;
//! and a configuration that cannot run is refused at start-up naming the flag.

mod common;
use common::{loss_bits, offload_corpus, tiny_stage3, tiny_zero_train, TempDir};
use std::path::Path;
use zero::ZeroStage;
use zero_train::plan::plan_report::stage_plans;
use zero_train::{train, ByteSize, OffloadTier, PrecisionArg, TrainConfig};

/// [`tiny_stage3`] in `precision` with 1 KiB gradient buckets, the optimizer and the
/// parameter shards at `tiers`.
fn tiny(data: &Path, precision: PrecisionArg, tiers: (OffloadTier, OffloadTier)) -> TrainConfig {
    let files = tiers.0 == OffloadTier::Nvme || tiers.1 == OffloadTier::Nvme;
    TrainConfig {
        precision,
        reduce_bucket_size: ByteSize(1024),
        offload_optimizer: tiers.0,
        offload_params: tiers.1,
        nvme_path: files.then(|| data.join("nvme")),
        ..tiny_stage3(data)
    }
}

#[test]
fn offloaded_shards_train_the_losses_of_shards_on_the_device_to_the_bit() {
    let dir = TempDir::new("params-bits");
    offload_corpus(&dir.0, 11);
    use OffloadTier::{Cpu, Nvme, Off};
    for precision in [PrecisionArg::Fp32, PrecisionArg::Bf16] {
        for checkpointing in [false, true] {
            let run = |tiers| {
                let cfg = TrainConfig {
                    activation_checkpointing: checkpointing,
                    ..tiny(&dir.0, precision, tiers)
                };
                train(&cfg).unwrap()
            };
            let what = format!("{precision:?}, checkpointing {checkpointing}");
            let plain = run((Off, Off));
            assert_ne!(plain.losses[0], plain.losses[3], "{what}: nothing trained");
            for tiers in [(Cpu, Cpu), (Nvme, Cpu), (Cpu, Nvme), (Nvme, Nvme)] {
                let got = run(tiers);
                assert_eq!(
                    loss_bits(&got.losses),
                    loss_bits(&plain.losses),
                    "{what}, {tiers:?}"
                );
            }
        }
    }
}

#[test]
fn each_tier_holds_what_the_plan_says() {
    let dir = TempDir::new("params-plan");
    offload_corpus(&dir.0, 11);
    for tiers in [
        (OffloadTier::Cpu, OffloadTier::Cpu),
        (OffloadTier::Nvme, OffloadTier::Nvme),
    ] {
        let cfg = tiny(&dir.0, PrecisionArg::Bf16, tiers);
        let (_, plans) = stage_plans(&cfg).unwrap();
        let plan = plans.iter().find(|p| p.stage == ZeroStage::Zero3).unwrap();
        let offload = plan.plan.offload.unwrap();
        let ran = train(&cfg).unwrap();
        for r in &ran.ranks {
            let what = format!("{tiers:?}, rank {}", r.rank);
            assert_eq!(r.params_offloaded_bytes, offload.params, "{what}");
            assert_eq!(r.params_file_bytes, offload.params_file, "{what}");
            assert_eq!(r.optimizer_file_bytes, offload.file, "{what}");
            // At a capacity of exactly the plan, buckets in flight may be landed early:
            // the peak never passes the plan.
            assert!(r.peak_bytes <= plan.plan.total(), "{what}");
            // Each step reads and writes every optimizer state the file holds, and the
            // shards besides.
            let io = r.file_io_per_step;
            let states = r.measured.optimizer as u64;
            if tiers.0 == OffloadTier::Nvme {
                assert!(
                    io.read_bytes > states && io.written_bytes > states,
                    "{what}: {io:?}"
                );
                assert!(
                    io.read_seconds > 0.0 && io.write_seconds > 0.0,
                    "{what}: {io:?}"
                );
            } else {
                assert_eq!(io, zero::FileIo::default(), "{what}");
            }
        }
        let one_tier_has_bytes = offload.params > 0 || offload.params_file > 0;
        assert!(one_tier_has_bytes, "{tiers:?}: {offload:?}");
    }
}

#[test]
fn a_checkpoint_saved_with_shards_in_files_resumes_without_offload_to_the_bit() {
    let dir = TempDir::new("params-resume");
    offload_corpus(&dir.0, 11);
    let save = dir.0.join("ckpt");
    let nvme = (OffloadTier::Nvme, OffloadTier::Nvme);
    let off = (OffloadTier::Off, OffloadTier::Off);
    let whole = train(&TrainConfig {
        save: Some(save.clone()),
        save_every: 2,
        ..tiny(&dir.0, PrecisionArg::Fp32, nvme)
    })
    .unwrap();
    let step2 = save.join("step-000002");
    for tiers in [off, nvme] {
        let resumed = train(&TrainConfig {
            resume: Some(step2.clone()),
            ..tiny(&dir.0, PrecisionArg::Fp32, tiers)
        })
        .unwrap();
        assert_eq!(
            loss_bits(&resumed.losses),
            loss_bits(&whole.losses[2..]),
            "{tiers:?}"
        );
    }
}

#[test]
fn a_configuration_parameter_offload_cannot_run_is_refused_naming_the_flag() {
    let dir = TempDir::new("params-refused");
    offload_corpus(&dir.0, 11);
    let nvme = dir.0.join("nvme");
    let nvme = nvme.to_str().unwrap();
    let cases: [(&[&str], &str); 5] = [
        (
            &["--offload-optimizer", "--offload-params"],
            "needs --zero-stage 3",
        ),
        (
            &["--zero-stage", "3", "--offload-params"],
            "needs --offload-optimizer",
        ),
        (
            &[
                "--zero-stage",
                "3",
                "--offload-optimizer",
                "--offload-params",
                "nvme",
            ],
            "--offload-params nvme keeps the parameter shards in files: give the folder",
        ),
        (
            &["--zero-stage", "3", "--offload-params", "disk"],
            "\"disk\" is not an offload tier",
        ),
        (
            &[
                "--zero-stage",
                "3",
                "--offload-optimizer",
                "--offload-params",
                "--host-memory-limit",
                "4K",
            ],
            "4096",
        ),
    ];
    for (flags, want) in cases {
        let (ok, text) = tiny_zero_train(&dir.0, flags);
        assert!(!ok && text.contains(want), "{flags:?}: {text}");
    }
    let flags = [
        "--zero-stage",
        "3",
        "--offload-optimizer",
        "nvme",
        "--offload-params",
        "nvme",
    ];
    let (ok, text) = tiny_zero_train(&dir.0, &[&flags[..], &["--nvme-path", nvme]].concat());
    assert!(ok, "{text}");
    assert_eq!(
        std::fs::read_dir(dir.0.join("nvme")).unwrap().count(),
        0,
        "files left behind"
    );
}
