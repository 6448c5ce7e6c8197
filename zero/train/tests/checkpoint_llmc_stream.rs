//! `--export-llmc` streams the model unit by unit: the file llm.c's layout puts every tensor
//! in, read back by the whole-file reader; a failed or unfinished export leaves no file; and
//! exporting from a stage-3 engine adds nothing to the arena's training peak.

mod common;

use common::TempDir;
use zero::{EngineConfig, ZeroStage};
use zero_gpt::{init_unit, Gpt, GptConfig, Rng};
use zero_train::bridge::{
    activation_arena_bytes, arena_activations, full_params, gpt_engine, micro_step,
    ActivationPlacement,
};
use zero_train::checkpoint::{LlmcCheckpoint, LlmcStreamWriter, ModelShape};

const T: usize = 8;

/// L=2, NH=2, C=64, V=100 (padded to 128).
fn config() -> GptConfig {
    GptConfig::new(T, 100, 2, 2, 64).unwrap()
}

/// Distinct values per unit and element, so a misplaced piece cannot go unnoticed.
fn units(shape: &ModelShape) -> Vec<Vec<f32>> {
    shape
        .unit_sizes()
        .iter()
        .enumerate()
        .map(|(u, &n)| (0..n).map(|i| u as f32 * 1e5 + i as f32).collect())
        .collect()
}

#[test]
fn units_written_in_any_order_read_back_whole() {
    let dir = TempDir::new("llmc-stream-order");
    let path = dir.0.join("new folder").join("model.bin");
    let shape = ModelShape::from_config(&config());
    let want = units(&shape);
    let mut writer = LlmcStreamWriter::create(&path, shape).unwrap();
    for u in (0..want.len()).rev() {
        writer.write_unit(u, &want[u]).unwrap();
    }
    assert!(!path.exists(), "published before finish");
    writer.finish().unwrap();
    let got = LlmcCheckpoint::load(&path).unwrap();
    assert_eq!(got.to_units().unwrap(), want);
    // llm.c's own order: wte first, then wpe, then ln1w of every layer.
    let c = 64;
    assert_eq!(got.params()[0], 0.0);
    assert_eq!(
        got.tensor("ln1w").unwrap()[c],
        2e5,
        "layer 1's ln1w follows layer 0's"
    );
}

#[test]
fn a_wrong_unit_or_an_unfinished_export_leaves_no_file() {
    let dir = TempDir::new("llmc-stream-unfinished");
    let path = dir.0.join("model.bin");
    let shape = ModelShape::from_config(&config());
    let want = units(&shape);
    let mut writer = LlmcStreamWriter::create(&path, shape).unwrap();
    assert!(writer.write_unit(want.len(), &want[0]).is_err());
    assert!(writer.write_unit(0, &want[0][1..]).is_err());
    writer.write_unit(0, &want[0]).unwrap();
    let err = writer.finish().unwrap_err().to_string();
    assert!(err.contains("unit 1"), "{err}");
    let writer = LlmcStreamWriter::create(&path, shape).unwrap();
    drop(writer);
    assert_eq!(std::fs::read_dir(&dir.0).unwrap().count(), 0);
}

#[test]
fn a_stage_three_export_adds_nothing_to_the_training_peak() {
    let cfg = config();
    let dir = TempDir::new("llmc-stream-stage3");
    let path = dir.0.join("model.bin");
    let comms = zero_comm::local::create(2).unwrap();
    let path_ref = &path;
    let results: Vec<(usize, usize, Vec<Vec<f32>>)> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|comm| {
                s.spawn(move || {
                    let model = Gpt::new(cfg).unwrap();
                    let layout = model.layout().clone();
                    let placement = ActivationPlacement::default();
                    let config = EngineConfig {
                        stage: ZeroStage::Zero3,
                        activation_bytes: activation_arena_bytes(&cfg, 1, T, placement).unwrap(),
                        ..EngineConfig::default()
                    };
                    let mut engine = gpt_engine(comm, &layout, None, config, |u, w| {
                        init_unit(&cfg, &layout, u, 7, w).unwrap()
                    })
                    .unwrap();
                    let mut acts = arena_activations(&mut engine, &model, 1, T, placement).unwrap();
                    let mut rng = Rng::new(engine.rank() as u64);
                    let seq: Vec<u32> = (0..=T).map(|_| (rng.next_u64() % 100) as u32).collect();
                    micro_step(&mut engine, &model, &mut acts, &seq[..T], &seq[1..]).unwrap();
                    engine.step(1e-2).unwrap();
                    let before = engine.arena().stats().peak_allocated;
                    let shape = ModelShape::from_config(&cfg);
                    let mut writer = (engine.rank() == 0)
                        .then(|| LlmcStreamWriter::create(path_ref, shape).unwrap());
                    for u in 0..engine.units().len() {
                        engine
                            .with_whole_params(u, |v| {
                                writer.as_mut().map(|w| w.write_unit(u, v).unwrap())
                            })
                            .unwrap();
                    }
                    if let Some(w) = writer {
                        w.finish().unwrap();
                    }
                    engine.comm().barrier().unwrap();
                    let after = engine.arena().stats().peak_allocated;
                    (before, after, full_params(&mut engine).unwrap())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (before, after, _) in &results {
        assert_eq!(before, after, "the export raised the arena's peak");
    }
    let file = LlmcCheckpoint::load(&path).unwrap().to_units().unwrap();
    assert_eq!(file, results[0].2, "the file holds the gathered parameters");
}

#[test]
fn a_destination_that_cannot_be_written_is_refused_before_training() {
    let dir = TempDir::new("llmc-stream-destination");
    let file = dir.0.join("a file");
    std::fs::write(&file, b"not a folder").unwrap();
    let err = LlmcStreamWriter::check_destination(&file.join("model.bin")).unwrap_err();
    assert!(err.to_string().contains("a file"), "{err}");
    let fine = dir.0.join("new").join("model.bin");
    LlmcStreamWriter::check_destination(&fine).unwrap();
    assert!(fine.parent().unwrap().is_dir());
    assert_eq!(
        std::fs::read_dir(fine.parent().unwrap()).unwrap().count(),
        0
    );
}
