//! Saving a run and resuming it to the bit.
//!
//! The state is world-size independent: whole parameters and Adam moments per unit (as the
//! engine exports them), the optimizer step count, the data loader's position and the run's
//! configuration. The learning rate is a function of the step and the sample RNG is seeded,
//! so nothing else is needed for the resumed run to continue exactly as the unbroken one.

use super::config::TrainConfig;
use super::error::TrainError;
use crate::checkpoint::{LlmcCheckpoint, ModelShape, StateReader, StateWriter};
use crate::data::{DataLoader, LoaderState};
use serde_json::json;
use std::path::{Path, PathBuf};
use zero::{Engine, UnitState};
use zero_gpt::GptConfig;

/// The folder a save at `step` goes into, inside the `--save` directory.
pub fn step_dir(save: &Path, step: u64) -> PathBuf {
    save.join(format!("step-{step:06}"))
}

/// The state folder `--resume` names: a `step-NNNNNN` folder itself, or the `--save`
/// directory, whose latest step folder is taken.
fn resolve_resume(dir: &Path) -> PathBuf {
    let step_of =
        |p: &Path| -> Option<u64> { p.file_name()?.to_str()?.strip_prefix("step-")?.parse().ok() };
    let latest = std::fs::read_dir(dir).ok().and_then(|entries| {
        entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter_map(|p| step_of(&p).map(|n| (n, p)))
            .max_by_key(|(n, _)| *n)
            .map(|(_, p)| p)
    });
    latest.unwrap_or_else(|| dir.to_path_buf())
}

fn tensor_name(unit: usize, what: &str) -> String {
    format!("unit{unit}/{what}")
}

/// Writes `states` and the run's position into `dir` (atomically replaced).
///
/// # Errors
/// Checkpoint I/O errors naming the directory.
pub fn save_state(
    dir: &Path,
    cfg: &TrainConfig,
    model: &GptConfig,
    states: &[UnitState],
    engine_steps: u64,
    loader: &LoaderState,
    step: u64,
) -> Result<(), TrainError> {
    let mut w = StateWriter::create(dir)?;
    for (unit, s) in states.iter().enumerate() {
        w.write(&tensor_name(unit, "params"), &s.params)?;
        w.write(&tensor_name(unit, "adam_m"), &s.m)?;
        w.write(&tensor_name(unit, "adam_v"), &s.v)?;
    }
    let meta = json!({
        "model": model,
        "units": states.len(),
        "engine_steps": engine_steps,
        "loader": loader,
        "config": cfg,
    });
    w.finish(step, meta)?;
    Ok(())
}

/// Loads a saved state into `engine` and `loader`; returns the step to continue from.
///
/// # Errors
/// [`TrainError::Resume`] when the saved model differs from this run's, checkpoint errors
/// for missing or corrupt files.
pub fn load_state(
    dir: &Path,
    model: &GptConfig,
    engine: &mut Engine,
    loader: &mut DataLoader,
) -> Result<u64, TrainError> {
    let dir = resolve_resume(dir);
    let bad = |reason: String| TrainError::Resume {
        dir: dir.clone(),
        reason,
    };
    let mut r = StateReader::open(&dir)?;
    let meta = r.meta().clone();
    let saved: GptConfig = serde_json::from_value(meta["model"].clone())
        .map_err(|e| bad(format!("no model shape in the state ({e})")))?;
    if saved != *model {
        return Err(bad(format!(
            "it holds a model of shape {saved:?}, this run builds {model:?}"
        )));
    }
    let engine_steps = meta["engine_steps"]
        .as_u64()
        .ok_or_else(|| bad("no optimizer step count in the state".into()))?;
    // The engine counts one optimizer step per training step at most (fewer once fp16
    // overflows skip some), and the count grows by one per step from here: a larger figure
    // is an edited or corrupt manifest.
    if engine_steps > r.step() {
        return Err(bad(format!(
            "its engine_steps {engine_steps} exceeds its step {}",
            r.step()
        )));
    }
    let loader_state: LoaderState = serde_json::from_value(meta["loader"].clone())
        .map_err(|e| bad(format!("no data loader position in the state ({e})")))?;
    let states = (0..engine.units().len())
        .map(|unit| {
            Ok(UnitState {
                params: r.read(&tensor_name(unit, "params"))?,
                m: r.read(&tensor_name(unit, "adam_m"))?,
                v: r.read(&tensor_name(unit, "adam_v"))?,
            })
        })
        .collect::<Result<Vec<_>, TrainError>>()?;
    engine.import_states(&states, engine_steps)?;
    loader.restore(&loader_state)?;
    Ok(r.step())
}

/// llm.c's header fields for `model`.
fn llmc_shape(model: &GptConfig) -> ModelShape {
    ModelShape {
        max_t: model.max_seq_len,
        vocab: model.vocab_size,
        padded_vocab: model.padded_vocab_size,
        layers: model.num_layers,
        heads: model.num_heads,
        channels: model.channels,
    }
}

/// Starts `engine` from an llm.c float32 checkpoint (fresh optimizer state).
///
/// # Errors
/// [`TrainError::Resume`] when the checkpoint's shape differs from the model's; checkpoint
/// errors for missing or corrupt files.
pub fn load_llmc(path: &Path, model: &GptConfig, engine: &mut Engine) -> Result<(), TrainError> {
    let ckpt = LlmcCheckpoint::load(path)?;
    if *ckpt.shape() != llmc_shape(model) {
        return Err(TrainError::Resume {
            dir: path.to_path_buf(),
            reason: format!(
                "the checkpoint's model is {:?}, this run builds {:?} (pass matching --layers \
                 --heads --dim --vocab and a --seq-len no longer than its maxT)",
                ckpt.shape(),
                llmc_shape(model)
            ),
        });
    }
    let states: Vec<UnitState> = ckpt
        .to_units()?
        .into_iter()
        .map(|params| UnitState {
            m: vec![0.0; params.len()],
            v: vec![0.0; params.len()],
            params,
        })
        .collect();
    engine.import_states(&states, 0)?;
    Ok(())
}

/// Writes whole parameters as an llm.c float32 checkpoint.
///
/// # Errors
/// Checkpoint I/O errors naming the file.
pub fn save_llmc(path: &Path, model: &GptConfig, states: &[UnitState]) -> Result<(), TrainError> {
    let units: Vec<&[f32]> = states.iter().map(|s| s.params.as_slice()).collect();
    LlmcCheckpoint::from_units(llmc_shape(model), &units)?.save(path)?;
    Ok(())
}
