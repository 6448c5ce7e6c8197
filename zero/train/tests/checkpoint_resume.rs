//! Resuming whole training runs from sharded states: at another world size and stage the
//! parameters right after loading are the saved ones to the bit and the loss curve
//! continues within floating-point tolerance; damaged or foreign states are refused with
//! errors that name the file and piece, and nothing is overwritten.

mod common;
use common::{learnable_corpus, TempDir};

use std::path::{Path, PathBuf};
use zero::ZeroStage;
use zero_state::{verify_state, StateError};
use zero_train::checkpoint::CheckpointError;
use zero_train::{train, OffloadTier, PrecisionArg, TrainConfig, TrainError};

/// Largest |loss difference| allowed between a run resumed at another world size or stage
/// and the unbroken run, over the 3 steps after the resume. Each step sees the same set of
/// sequences whatever the rank count (data/loader.rs); what differs is the order in which
/// gradients are summed across ranks and micro-steps, i.e. f32 rounding. Measured: at most
/// 2.4e-7 (half an ulp of a loss near 4.6); the bound is 40 times that.
const CROSS_WORLD_LOSS_TOL: f32 = 1e-5;

/// The tiny model (2 layers, dim 32), 4 sequences of 16 tokens per step.
fn tiny(data: &Path, world: usize, stage: ZeroStage) -> TrainConfig {
    TrainConfig {
        model: "tiny".into(),
        seq_len: 16,
        data: data.to_path_buf(),
        world_size: world,
        zero_stage: stage,
        steps: 6,
        batch_size: 4,
        micro_batch_size: 1,
        warmup_steps: 2,
        eval_every: 0,
        sample_tokens: 0,
        lr: 1e-2,
        ..TrainConfig::default()
    }
}

/// Trains 6 steps at (`world`, `stage`), saving after step 3 and 6; returns the losses.
fn saved_run(data: &Path, save: &Path, world: usize, stage: ZeroStage) -> Vec<f32> {
    let cfg = TrainConfig {
        save: Some(save.to_path_buf()),
        save_every: 3,
        ..tiny(data, world, stage)
    };
    train(&cfg).unwrap().losses
}

/// The parameters right after loading step 3 at (`world`, `stage`), as llm.c bytes.
fn params_after_load(data: &Path, state: &Path, world: usize, stage: ZeroStage) -> Vec<u8> {
    let out = data.join(format!("loaded-{world}-{}.bin", stage as u8));
    train(&TrainConfig {
        resume: Some(state.to_path_buf()),
        steps: 3,
        export_llmc: Some(out.clone()),
        ..tiny(data, world, stage)
    })
    .unwrap();
    std::fs::read(out).unwrap()
}

fn check_resumes(from: (usize, ZeroStage), to: &[(usize, ZeroStage)]) {
    let dir = TempDir::new(&format!("x{}{}", from.0, from.1 as u8));
    learnable_corpus(&dir.0);
    let save = dir.0.join("ckpt");
    let whole = saved_run(&dir.0, &save, from.0, from.1);
    let step3 = save.join("step-000003");
    let saved_params = params_after_load(&dir.0, &step3, from.0, from.1);
    for &(world, stage) in to {
        assert!(
            params_after_load(&dir.0, &step3, world, stage) == saved_params,
            "parameters after loading at N_d={world} {stage} differ"
        );
        let resumed = train(&TrainConfig {
            resume: Some(step3.clone()),
            ..tiny(&dir.0, world, stage)
        })
        .unwrap();
        for (got, want) in resumed.losses.iter().zip(&whole[3..]) {
            assert!(
                (got - want).abs() <= CROSS_WORLD_LOSS_TOL,
                "N_d={world} {stage}: loss {got} vs unbroken {want}"
            );
        }
        assert_eq!(resumed.losses.len(), 3);
    }
}

#[test]
fn four_ranks_stage_three_resume_at_two_ranks_stage_one_and_one_rank_stage_zero() {
    check_resumes(
        (4, ZeroStage::Zero3),
        &[(2, ZeroStage::Zero1), (1, ZeroStage::Zero0)],
    );
}

#[test]
fn one_rank_stage_zero_resumes_at_two_ranks_stage_one_and_four_ranks_stage_three() {
    check_resumes(
        (1, ZeroStage::Zero0),
        &[(2, ZeroStage::Zero1), (4, ZeroStage::Zero3)],
    );
}

#[test]
fn async_saves_hold_the_same_bytes_and_resume_to_the_bit() {
    let dir = TempDir::new("async");
    learnable_corpus(&dir.0);
    let (fg, bg) = (dir.0.join("fg"), dir.0.join("bg"));
    let sync = saved_run(&dir.0, &fg, 2, ZeroStage::Zero2);
    let cfg = TrainConfig {
        save: Some(bg.clone()),
        save_every: 2,
        async_save: true,
        ..tiny(&dir.0, 2, ZeroStage::Zero2)
    };
    let asynchronous = train(&cfg).unwrap().losses;
    assert_eq!(sync, asynchronous);
    for rank in 0..2 {
        let name = format!("step-000006/rank-0000{rank}.bin");
        assert!(std::fs::read(fg.join(&name)).unwrap() == std::fs::read(bg.join(&name)).unwrap());
    }
    // Saves at 2 and 4 were written in the background and published by the next save.
    let resumed = train(&TrainConfig {
        resume: Some(bg.join("step-000004")),
        ..tiny(&dir.0, 2, ZeroStage::Zero2)
    })
    .unwrap();
    assert_eq!(resumed.losses, sync[4..]);
}

#[test]
fn keep_last_prunes_old_states_and_latest_names_the_newest() {
    let dir = TempDir::new("keep");
    learnable_corpus(&dir.0);
    let save = dir.0.join("ckpt");
    train(&TrainConfig {
        save: Some(save.clone()),
        save_every: 1,
        keep_last: 2,
        steps: 4,
        ..tiny(&dir.0, 2, ZeroStage::Zero2)
    })
    .unwrap();
    let mut names: Vec<String> = std::fs::read_dir(&save)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["latest", "step-000003", "step-000004"]);
    assert_eq!(
        std::fs::read_to_string(save.join("latest")).unwrap(),
        "step-000004\n"
    );
    assert_eq!(verify_state(&save).unwrap().1, 4);
}

/// A state saved by a 2-rank, 1-step run, and the bytes of every file in it.
fn one_state(dir: &Path) -> (PathBuf, Vec<(PathBuf, Vec<u8>)>) {
    learnable_corpus(dir);
    let save = dir.join("ckpt");
    train(&TrainConfig {
        save: Some(save.clone()),
        steps: 1,
        ..tiny(dir, 2, ZeroStage::Zero3)
    })
    .unwrap();
    let state = save.join("step-000001");
    let mut files: Vec<(PathBuf, Vec<u8>)> = std::fs::read_dir(&state)
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p| (p.clone(), std::fs::read(p).unwrap()))
        .collect();
    files.sort();
    (state, files)
}

/// Resumes `state` at 2 ranks stage 3 for 2 steps, expecting an error; checks that no file
/// of the state changed.
fn refused(dir: &Path, state: &Path, cfg: impl FnOnce(TrainConfig) -> TrainConfig) -> TrainError {
    let before: Vec<_> = std::fs::read_dir(state)
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            (p.clone(), std::fs::read(p).unwrap())
        })
        .collect();
    let base = TrainConfig {
        resume: Some(state.to_path_buf()),
        steps: 2,
        ..tiny(dir, 2, ZeroStage::Zero3)
    };
    let err = train(&cfg(base)).unwrap_err();
    for (p, bytes) in before {
        assert_eq!(std::fs::read(&p).unwrap(), bytes, "{} changed", p.display());
    }
    err
}

#[test]
fn a_flipped_byte_names_the_file_and_the_piece() {
    let dir = TempDir::new("flip");
    let (state, _) = one_state(&dir.0);
    let piece = state.join("rank-00001.bin");
    let mut bytes = std::fs::read(&piece).unwrap();
    bytes[4] ^= 0x40; // element 1 of rank 1's first piece: unit 0's parameters
    std::fs::write(&piece, bytes).unwrap();
    let err = refused(&dir.0, &state, |c| c);
    match &err {
        TrainError::Checkpoint(CheckpointError::State(StateError::ChecksumMismatch {
            path,
            name,
            ..
        })) => {
            assert_eq!(path, &piece);
            assert!(name.starts_with("unit0/params["), "{name}");
        }
        other => panic!("expected a checksum mismatch, got {other}"),
    }
}

#[test]
fn a_missing_or_truncated_piece_file_is_named() {
    let dir = TempDir::new("missing");
    let (state, _) = one_state(&dir.0);
    let piece = state.join("rank-00001.bin");
    let bytes = std::fs::read(&piece).unwrap();
    std::fs::write(&piece, &bytes[..bytes.len() - 4]).unwrap();
    let err = refused(&dir.0, &state, |c| c);
    assert!(
        matches!(&err, TrainError::Checkpoint(CheckpointError::State(StateError::Tensor { path, name, .. }))
            if path == &piece && name.starts_with("unit0/params")),
        "{err}"
    );
    assert!(err.to_string().contains("truncated"), "{err}");
    std::fs::remove_file(&piece).unwrap();
    let err = refused(&dir.0, &state, |c| c);
    assert!(
        matches!(&err, TrainError::Checkpoint(CheckpointError::State(StateError::Tensor { path, .. })) if path == &piece),
        "{err}"
    );
}

#[test]
fn a_newer_format_version_another_precision_or_shape_is_refused() {
    let dir = TempDir::new("foreign");
    let (state, _) = one_state(&dir.0);
    let err = refused(&dir.0, &state, |c| TrainConfig {
        precision: PrecisionArg::Bf16,
        ..c
    });
    assert!(
        matches!(err, TrainError::Resume { .. }) && err.to_string().contains("precision"),
        "{err}"
    );
    let err = refused(&dir.0, &state, |c| TrainConfig { dim: Some(64), ..c });
    assert!(matches!(err, TrainError::Resume { .. }), "{err}");
    let manifest = state.join("manifest.json");
    let text = std::fs::read_to_string(&manifest).unwrap();
    std::fs::write(
        &manifest,
        text.replacen("\"version\": 2", "\"version\": 3", 1),
    )
    .unwrap();
    let err = refused(&dir.0, &state, |c| c);
    assert!(
        matches!(
            err,
            TrainError::Checkpoint(CheckpointError::State(StateError::BadState { .. }))
        ) && err.to_string().contains("version 3"),
        "{err}"
    );
}

#[test]
fn a_latest_pointing_nowhere_is_refused_and_without_it_the_highest_step_is_taken() {
    let dir = TempDir::new("latest");
    let (state, _) = one_state(&dir.0);
    let save = state.parent().unwrap().to_path_buf();
    std::fs::write(save.join("latest"), "step-000009\n").unwrap();
    let err = refused(&dir.0, &state, |c| TrainConfig {
        resume: Some(save.clone()),
        ..c
    });
    assert!(
        matches!(&err, TrainError::Checkpoint(CheckpointError::State(StateError::BadState { path, .. }))
            if path == &save.join("latest")),
        "{err}"
    );
    std::fs::remove_file(save.join("latest")).unwrap();
    // A partial folder of a later step is never taken.
    std::fs::create_dir(save.join("step-000002.partial")).unwrap();
    assert_eq!(verify_state(&save).unwrap(), (state, 1));
}

/// ZeRO-Offload keeps the optimizer states elsewhere, not otherwise: a run with them
/// offloaded (to the host arena, or to files) trains the same losses and saves the same
/// bytes as one without, and each resumes from the other's state to the bit; at stage 0 in
/// fp32, stage 2 in bf16 and stage 3 in fp32.
#[test]
fn offloaded_optimizer_states_save_and_resume_as_the_device_ones() {
    let dir = TempDir::new("offload");
    learnable_corpus(&dir.0);
    let nvme = dir.0.join("nvme");
    std::fs::create_dir(&nvme).unwrap();
    for (stage, precision) in [
        (ZeroStage::Zero0, PrecisionArg::Fp32),
        (ZeroStage::Zero2, PrecisionArg::Bf16),
        (ZeroStage::Zero3, PrecisionArg::Fp32),
    ] {
        let base = TrainConfig {
            precision,
            ..tiny(&dir.0, 2, stage)
        };
        let tag = format!("{}-{precision:?}", stage as u8);
        check_offload_tiers(&dir.0.join(tag), &nvme, &base);
    }
    // Every run's file went with its engine.
    assert_eq!(std::fs::read_dir(&nvme).unwrap().count(), 0);
}

/// [`offloaded_optimizer_states_save_and_resume_as_the_device_ones`] for `base`, saving
/// under `saves`, the file tier in `nvme`.
fn check_offload_tiers(saves: &Path, nvme: &Path, base: &TrainConfig) {
    let run = |save: &Path, tier: OffloadTier, resume: Option<PathBuf>| {
        let cfg = TrainConfig {
            save: Some(save.to_path_buf()),
            save_every: 3,
            offload_optimizer: tier,
            nvme_path: (tier == OffloadTier::Nvme).then(|| nvme.to_path_buf()),
            resume,
            ..base.clone()
        };
        train(&cfg).unwrap().losses
    };
    let home = |tier: OffloadTier| saves.join(format!("{tier:?}"));
    let what = format!("{} {:?}", base.zero_stage, base.precision);
    let device_losses = run(&home(OffloadTier::Off), OffloadTier::Off, None);
    for tier in [OffloadTier::Cpu, OffloadTier::Nvme] {
        assert_eq!(
            run(&home(tier), tier, None),
            device_losses,
            "{what} {tier:?}"
        );
        for rank in 0..2 {
            let name = format!("step-000006/rank-0000{rank}.bin");
            let (a, b) = (home(OffloadTier::Off).join(&name), home(tier).join(&name));
            assert!(
                std::fs::read(a).unwrap() == std::fs::read(b).unwrap(),
                "{what} {tier:?} {name}"
            );
        }
    }
    let step3 = |tier| Some(home(tier).join("step-000003"));
    let again = saves.join("again");
    for (from, to) in [
        (OffloadTier::Off, OffloadTier::Cpu),
        (OffloadTier::Cpu, OffloadTier::Off),
        (OffloadTier::Off, OffloadTier::Nvme),
        (OffloadTier::Nvme, OffloadTier::Off),
    ] {
        let resumed = run(&again, to, step3(from));
        let case = format!("{what}: {to:?} from {from:?}'s state");
        assert_eq!(resumed, device_losses[3..], "{case}");
    }
}
