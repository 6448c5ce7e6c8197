//! `--offload-gradients` through `zero-train`: the kept gradients accumulated in the host
//! arena as their reductions land train the losses of gradients on the device to the bit,
//! at every stage, fp32 and bf16, with gradient accumulation, beside each optimizer tier
//! and the parameter tiers; the device's plan drops by exactly its gradient bytes and the
//! host arena's gains the gradient blocks a run measures, peaking at its plan; and a
//! configuration that cannot run is refused at start-up naming the flag.

mod common;
use common::{loss_bits, offload_corpus, tiny_stage3, tiny_zero_train, TempDir};
use std::path::Path;
use zero::ZeroStage;
use zero_train::plan::plan_report::stage_plans;
use zero_train::{train, ByteSize, Device, OffloadTier, PrecisionArg, TrainConfig};

/// [`tiny_stage3`] at `stage` in `precision`, 1 KiB buckets, two micro-steps a step, the
/// optimizer and parameters at `tiers`, the gradients offloaded when `grads`.
fn tiny(
    data: &Path,
    (stage, precision): (ZeroStage, PrecisionArg),
    tiers: (OffloadTier, OffloadTier),
    grads: bool,
) -> TrainConfig {
    let files = tiers.0 == OffloadTier::Nvme || tiers.1 == OffloadTier::Nvme;
    TrainConfig {
        zero_stage: stage,
        precision,
        batch_size: 4,
        reduce_bucket_size: ByteSize(1024),
        offload_optimizer: tiers.0,
        offload_params: tiers.1,
        offload_gradients: grads,
        nvme_path: files.then(|| data.join("nvme")),
        ..tiny_stage3(data)
    }
}

#[test]
fn offloaded_gradients_train_the_losses_of_gradients_on_the_device_to_the_bit() {
    let dir = TempDir::new("grads-bits");
    offload_corpus(&dir.0, 5);
    use OffloadTier::{Cpu, Nvme, Off};
    for precision in [PrecisionArg::Fp32, PrecisionArg::Bf16] {
        for stage in ZeroStage::ALL {
            let at = (stage, precision);
            let plain = train(&tiny(&dir.0, at, (Off, Off), false)).unwrap();
            assert_ne!(plain.losses[0], plain.losses[3], "{at:?}: nothing trained");
            let mut tiers = vec![(Cpu, Off), (Nvme, Off)];
            if stage == ZeroStage::Zero3 {
                tiers.extend([(Cpu, Cpu), (Nvme, Nvme)]);
            }
            for t in tiers {
                let got = train(&tiny(&dir.0, at, t, true)).unwrap();
                assert_eq!(
                    loss_bits(&got.losses),
                    loss_bits(&plain.losses),
                    "{at:?}, {t:?}"
                );
            }
        }
    }
}

#[test]
fn the_gradients_move_from_the_devices_plan_to_the_host_arena() {
    let dir = TempDir::new("grads-plan");
    offload_corpus(&dir.0, 5);
    let at = (ZeroStage::Zero2, PrecisionArg::Bf16);
    for optimizer in [OffloadTier::Cpu, OffloadTier::Nvme] {
        let tiers = (optimizer, OffloadTier::Off);
        let plan_of = |grads| {
            let (_, plans) = stage_plans(&tiny(&dir.0, at, tiers, grads)).unwrap();
            plans.into_iter().find(|p| p.stage == at.0).unwrap().plan
        };
        let (kept, moved) = (plan_of(false), plan_of(true));
        let host = moved.offload.unwrap();
        let ran = train(&tiny(&dir.0, at, tiers, true)).unwrap();
        let widest = ran.ranks.iter().map(|r| r.optimizer_offloaded_bytes).max();
        assert_eq!(widest, Some(host.optimizer_arena()), "{optimizer:?}");
        for r in &ran.ranks {
            let what = format!("{optimizer:?}, rank {}", r.rank);
            assert!(r.measured.grads > 0.0, "{what}");
            if optimizer == OffloadTier::Cpu {
                // The host arena's blocks are the rank arena's 256-byte ones.
                assert_eq!(kept.model_states.grads, r.measured.grads, "{what}");
            } else {
                // With a file tier the host arena's blocks are whole 4 KiB ones.
                assert_eq!(r.measured.grads as u64 % 4096, 0, "{what}");
                assert!(r.measured.grads >= kept.model_states.grads, "{what}");
            }
            assert_eq!(moved.model_states.grads, 0.0, "{what}");
            assert_eq!(host.grads as f64, r.measured.grads, "{what}");
            assert_eq!(r.grads_offloaded_bytes as f64, r.measured.grads, "{what}");
            let dropped = kept.total() - moved.total();
            assert_eq!(dropped as f64, kept.model_states.grads, "{what}");
            assert!(r.peak_bytes <= moved.total(), "{what}");
        }
    }
}

#[test]
fn gradient_offload_that_cannot_run_is_refused_naming_the_flag() {
    let dir = TempDir::new("grads-refused");
    offload_corpus(&dir.0, 5);
    let cases: [(&[&str], &str); 2] = [
        (&["--offload-gradients"], "needs --offload-optimizer"),
        (
            &["--offload-optimizer", "--offload-gradients=maybe"],
            "--offload-gradients",
        ),
    ];
    for (flags, expected) in cases {
        let (ok, err) = tiny_zero_train(&dir.0, flags);
        assert!(!ok, "{flags:?} ran");
        assert!(err.contains(expected), "{flags:?}: {err}");
    }
    for ran in [
        &["--offload-optimizer", "--offload-gradients"][..],
        &[
            "--offload-optimizer",
            "--offload-gradients",
            "--delayed-param-update",
        ],
    ] {
        let (ok, err) = tiny_zero_train(&dir.0, ran);
        assert!(ok, "{ran:?}: {err}");
    }
    // On the GPU it passes the checks: this GPU-less machine stops at the build or the
    // CUDA library, naming it.
    let gpu = [
        "--offload-optimizer",
        "--offload-gradients",
        "--device",
        "cuda",
    ];
    let (ok, err) = tiny_zero_train(&dir.0, &gpu);
    assert!(!ok && !err.contains("panicked"), "{err}");
    assert!(!err.contains("--offload-gradients"), "refused: {err}");
    assert!(
        err.contains("--features cuda") || err.contains("libcuda"),
        "{err}"
    );
}

/// Beside `--delayed-param-update` the gradients land in a host arena of their own (the
/// update's thread holds the optimizer's during the next backward): the losses are the
/// delayed update's with the gradients on the device, to the bit, at every stage, fp32 and
/// bf16, beside each optimizer tier; the device's plan drops by the gradients; the
/// gradients' arena peaks at their plan and the optimizer's host arena at its own.
#[test]
fn beside_the_delayed_update_offloaded_gradients_train_its_losses_to_the_bit() {
    let dir = TempDir::new("grads-delayed");
    offload_corpus(&dir.0, 5);
    use OffloadTier::{Cpu, Nvme, Off};
    for precision in [PrecisionArg::Fp32, PrecisionArg::Bf16] {
        for stage in ZeroStage::ALL {
            for optimizer in [Cpu, Nvme] {
                let what = format!("{precision:?} {stage} {optimizer:?}");
                let at = |grads| TrainConfig {
                    delayed_param_update: true,
                    ..tiny(&dir.0, (stage, precision), (optimizer, Off), grads)
                };
                let on_device = train(&at(false)).unwrap();
                let ran = train(&at(true)).unwrap();
                assert_eq!(
                    loss_bits(&ran.losses),
                    loss_bits(&on_device.losses),
                    "{what}"
                );
                let (_, plans) = stage_plans(&at(true)).unwrap();
                let plan = plans.into_iter().find(|p| p.stage == stage).unwrap().plan;
                let host = plan.offload.unwrap();
                assert!(host.grads_apart && plan.model_states.grads == 0.0, "{what}");
                let r = &ran.ranks[0];
                assert_eq!(r.grads_arena_peak_bytes, host.grads_arena(), "{what}");
                assert_eq!(r.grads_offloaded_bytes, host.grads, "{what}");
                assert_eq!(
                    r.optimizer_offloaded_bytes,
                    host.optimizer_arena(),
                    "{what}"
                );
                assert!(r.peak_bytes <= plan.total(), "{what}");
            }
        }
    }
}

/// `zero-train plan --device cuda` counts what a GPU's arena adds to the host: one landing
/// block of the largest segment a bucket lands (1 KiB buckets of f32 over 2 ranks: 128
/// elements, 512 bytes), beside the gradients; on the CPU none.
#[test]
fn on_a_gpu_the_plan_adds_one_landing_block() {
    let dir = TempDir::new("grads-gpu-plan");
    offload_corpus(&dir.0, 5);
    for delayed_param_update in [false, true] {
        let at = |device| {
            let cfg = TrainConfig {
                device,
                delayed_param_update,
                ..tiny(
                    &dir.0,
                    (ZeroStage::Zero2, PrecisionArg::Fp32),
                    (OffloadTier::Cpu, OffloadTier::Off),
                    true,
                )
            };
            let (_, plans) = stage_plans(&cfg).unwrap();
            let plan = plans.into_iter().find(|p| p.stage == ZeroStage::Zero2);
            plan.unwrap().plan.offload.unwrap()
        };
        let (cpu, gpu) = (at(Device::Cpu), at(Device::Cuda(None)));
        assert_eq!((cpu.landing, gpu.landing), (0, 512));
        let extra = match delayed_param_update {
            // Beside the delayed update the block sits in the gradients' own arena.
            true => 512,
            // Otherwise it shares the room of the update's larger staging.
            false => 0,
        };
        assert_eq!(
            gpu.total(),
            cpu.total() + extra,
            "delayed {delayed_param_update}"
        );
    }
}
