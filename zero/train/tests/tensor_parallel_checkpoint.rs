//! Sharded states under `--tensor-parallel-size T`: a state saved at T = 2 x DP = 2 resumes
//! at the same T to the bit and at T = 1 x DP = 4 within rounding, and the reverse; a state
//! written before the tensor-parallel axis existed reads as T = 1; a state whose recorded T
//! cannot be mapped is refused by name.

mod common;
use common::{learnable_corpus, TempDir};

use std::path::{Path, PathBuf};
use zero::ZeroStage;
use zero_train::{train, TrainConfig, TrainError};

/// Largest relative loss difference allowed between a run resumed at another T and the
/// unbroken run: the bound issue 22 sets for T = 2 against T = 1 (the row-parallel
/// products sum in another order).
const ACROSS_T_REL_TOL: f64 = 1e-6;

/// The tiny GPT (2 heads) on 4 ranks, `tp` of them per tensor-parallel group: 4 sequences
/// per step (the same ones at every T), 6 steps, no evaluation or sample.
fn tiny(data: &Path, tp: usize, stage: ZeroStage) -> TrainConfig {
    TrainConfig {
        model: "tiny".into(),
        seq_len: 16,
        data: data.to_path_buf(),
        world_size: 4,
        tensor_parallel_size: tp,
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

/// Trains 6 steps at (`tp`, `stage`), saving after step 3 into `save`; returns the losses
/// and the step-3 state.
fn saved_run(data: &Path, save: &Path, tp: usize, stage: ZeroStage) -> (Vec<f32>, PathBuf) {
    let cfg = TrainConfig {
        save: Some(save.to_path_buf()),
        save_every: 3,
        ..tiny(data, tp, stage)
    };
    let losses = train(&cfg).unwrap().losses;
    (losses, save.join("step-000003"))
}

/// The last 3 losses of a run resumed from `state` at (`tp`, `stage`).
fn resumed(data: &Path, state: &Path, tp: usize, stage: ZeroStage) -> Vec<f32> {
    let run = train(&TrainConfig {
        resume: Some(state.to_path_buf()),
        ..tiny(data, tp, stage)
    })
    .unwrap();
    assert_eq!(run.losses.len(), 3);
    run.losses
}

fn max_relative(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len());
    got.iter()
        .zip(want)
        .map(|(&g, &w)| (f64::from(g) - f64::from(w)).abs() / f64::from(w).abs())
        .fold(0.0, f64::max)
}

#[test]
fn a_state_saved_at_t2_resumes_at_t2_to_the_bit_and_at_t1_within_rounding() {
    let dir = TempDir::new("tpckpt-2to1");
    learnable_corpus(&dir.0);
    let (whole, state) = saved_run(&dir.0, &dir.0.join("ckpt"), 2, ZeroStage::Zero3);
    assert!(whole[0] > whole[5] + 0.1, "training moved: {whole:?}");
    let same = resumed(&dir.0, &state, 2, ZeroStage::Zero3);
    assert_eq!(same, whole[3..], "T = 2 resumed at T = 2, stage 3");
    for stage in [ZeroStage::Zero1, ZeroStage::Zero3] {
        let other = resumed(&dir.0, &state, 1, stage);
        let rel = max_relative(&other, &whole[3..]);
        eprintln!("T=2 x DP=2 stage 3 -> T=1 x DP=4 {stage}: max relative loss difference {rel:e}");
        assert!(
            rel < ACROSS_T_REL_TOL,
            "{stage}: {rel:e} ({other:?} vs {whole:?})"
        );
    }
}

/// A background save (`--async-save`) at T = 2 writes the bytes of a foreground one: each
/// rank's snapshot holds the units it writes (slices on every rank, the rest on rank 0).
#[test]
fn an_async_save_at_t2_writes_the_same_pieces() {
    let dir = TempDir::new("tpckpt-async");
    learnable_corpus(&dir.0);
    let run = |save: &Path, async_save: bool| {
        train(&TrainConfig {
            save: Some(save.to_path_buf()),
            save_every: 3,
            async_save,
            ..tiny(&dir.0, 2, ZeroStage::Zero2)
        })
        .unwrap()
        .losses
    };
    let (sync, bg) = (dir.0.join("sync"), dir.0.join("bg"));
    assert_eq!(run(&sync, false), run(&bg, true));
    for rank in 0..4 {
        let name = format!("step-000003/rank-{rank:05}.bin");
        let (a, b) = (
            std::fs::read(sync.join(&name)),
            std::fs::read(bg.join(&name)),
        );
        assert!(a.unwrap() == b.unwrap(), "{name}");
    }
}

#[test]
fn a_state_saved_at_t1_resumes_at_t2_within_rounding() {
    let dir = TempDir::new("tpckpt-1to2");
    learnable_corpus(&dir.0);
    let (whole, state) = saved_run(&dir.0, &dir.0.join("ckpt"), 1, ZeroStage::Zero2);
    for stage in [ZeroStage::Zero0, ZeroStage::Zero3] {
        let other = resumed(&dir.0, &state, 2, stage);
        let rel = max_relative(&other, &whole[3..]);
        eprintln!("T=1 x DP=4 stage 2 -> T=2 x DP=2 {stage}: max relative loss difference {rel:e}");
        assert!(
            rel < ACROSS_T_REL_TOL,
            "{stage}: {rel:e} ({other:?} vs {whole:?})"
        );
    }
}

/// Rewrites `state`'s manifest through `edit`.
fn edit_manifest(state: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = state.join("manifest.json");
    let mut manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    edit(&mut manifest);
    std::fs::write(&path, serde_json::to_vec_pretty(&manifest).unwrap()).unwrap();
}

#[test]
fn a_state_without_the_tensor_parallel_axis_reads_as_t1() {
    let dir = TempDir::new("tpckpt-v1");
    learnable_corpus(&dir.0);
    let (whole, state) = saved_run(&dir.0, &dir.0.join("ckpt"), 1, ZeroStage::Zero1);
    // The manifest as version 1 wrote it: no T, no piece's tensor-parallel rank.
    edit_manifest(&state, |m| {
        m["version"] = 1.into();
        m["partitioning"]
            .as_object_mut()
            .unwrap()
            .remove("tensor_parallel");
        for piece in m["pieces"].as_array_mut().unwrap() {
            piece.as_object_mut().unwrap().remove("tp_rank");
        }
    });
    assert_eq!(resumed(&dir.0, &state, 1, ZeroStage::Zero1), whole[3..]);
    let rel = max_relative(&resumed(&dir.0, &state, 2, ZeroStage::Zero1), &whole[3..]);
    assert!(rel < ACROSS_T_REL_TOL, "{rel:e}");
}

#[test]
fn a_recorded_t_that_cannot_split_the_model_is_refused_by_name() {
    let dir = TempDir::new("tpckpt-bad");
    learnable_corpus(&dir.0);
    let (_, state) = saved_run(&dir.0, &dir.0.join("ckpt"), 2, ZeroStage::Zero1);
    // The tiny model has 2 heads: T = 4 cannot hold whole heads.
    edit_manifest(&state, |m| m["partitioning"]["tensor_parallel"] = 4.into());
    let err = train(&TrainConfig {
        resume: Some(state.clone()),
        ..tiny(&dir.0, 1, ZeroStage::Zero1)
    })
    .unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, TrainError::Resume { .. })
            && text.contains("tensor-parallel size 4")
            && text.contains("--tensor-parallel-size"),
        "{text}"
    );
}

/// `zero-train export` of a state saved at T = 2 writes the whole model whose slices, cut
/// by zero-gpt's `slice_part`, are the pieces each tensor-parallel rank saved, to the bit.
#[test]
fn a_state_saved_at_t2_exports_the_whole_model_its_ranks_sliced() {
    use zero_gpt::{slice_part, unit_origin, ParamLayout, TpSplit};
    use zero_state::ShardedReader;
    use zero_train::checkpoint::export::{export, ExportArgs, ExportDtype, ExportFormat};
    use zero_train::checkpoint::LlmcCheckpoint;
    let dir = TempDir::new("tpckpt-export");
    learnable_corpus(&dir.0);
    let (_, state) = saved_run(&dir.0, &dir.0.join("ckpt"), 2, ZeroStage::Zero3);
    let to = dir.0.join("whole.bin");
    let args = ExportArgs {
        from: state.clone(),
        to: to.clone(),
        format: ExportFormat::Llmc,
        dtype: ExportDtype::Fp32,
        heads: None,
        max_shard_size: None,
    };
    let cfg = export(&args).unwrap();
    let whole = LlmcCheckpoint::load(&to).unwrap().to_units().unwrap();
    let reader = ShardedReader::open(&state).unwrap();
    // The trainer splits the blocks and the vocabulary at T > 1.
    let (layout, whole_layout) = (ParamLayout::split_vocab(&cfg, 2), ParamLayout::new(&cfg));
    for (unit, part) in layout.units().iter().enumerate() {
        let ranks = if part.kind.is_slice() { 2 } else { 1 };
        for rank in 0..ranks {
            let split = TpSplit { size: 2, rank };
            let w = unit_origin(&cfg, &layout, split, unit).unwrap().0;
            let mut saved = vec![0f32; part.len];
            reader
                .read_tp_range(rank, unit, "params", 0..part.len, &mut saved)
                .unwrap();
            // Each unit's tensors cut from its whole unit (slices by rank, the rest whole).
            let mut cut = vec![0f32; part.len];
            let from = &whole_layout.units()[w];
            slice_part(&cfg, split, from, &whole[w], part, &mut cut).unwrap();
            let bits = |xs: &[f32]| xs.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert!(bits(&saved) == bits(&cut), "unit {unit} tp rank {rank}");
        }
    }
}

/// `--export-llmc` at T = 2 writes the bytes `zero-train export` writes from the same run's
/// state (two paths: the group's slices all-gathered, and the state's pieces mapped); a
/// T = 2 run started `--init-from` that file and exporting before any step writes it back to
/// the bit; and T = 2 and T = 1 runs from it follow each other within rounding.
#[test]
fn init_from_and_export_llmc_at_t2_carry_the_whole_model() {
    use zero_train::checkpoint::export::{export, ExportArgs, ExportDtype, ExportFormat};
    let dir = TempDir::new("tpckpt-llmc");
    learnable_corpus(&dir.0);
    let trained = dir.0.join("trained.bin");
    train(&TrainConfig {
        save: Some(dir.0.join("ckpt")),
        save_every: 3,
        steps: 3,
        export_llmc: Some(trained.clone()),
        ..tiny(&dir.0, 2, ZeroStage::Zero3)
    })
    .unwrap();
    let from_state = dir.0.join("from-state.bin");
    export(&ExportArgs {
        from: dir.0.join("ckpt").join("step-000003"),
        to: from_state.clone(),
        format: ExportFormat::Llmc,
        dtype: ExportDtype::Fp32,
        heads: None,
        max_shard_size: None,
    })
    .unwrap();
    let bytes = std::fs::read(&trained).unwrap();
    assert!(
        bytes == std::fs::read(&from_state).unwrap(),
        "export paths differ"
    );
    let from_file = |tp: usize, steps: u64, export_llmc: Option<PathBuf>| {
        train(&TrainConfig {
            init_from: Some(trained.clone()),
            steps,
            export_llmc,
            ..tiny(&dir.0, tp, ZeroStage::Zero1)
        })
        .unwrap()
        .losses
    };
    let again = dir.0.join("again.bin");
    from_file(2, 0, Some(again.clone()));
    assert!(
        std::fs::read(&again).unwrap() == bytes,
        "init-from then export at T = 2"
    );
    let (split, whole) = (from_file(2, 3, None), from_file(1, 3, None));
    let rel = max_relative(&split, &whole);
    eprintln!("--init-from at T=2 x DP=2 vs T=1 x DP=4: max relative loss difference {rel:e}");
    assert!(rel < ACROSS_T_REL_TOL, "{rel:e}");
}
