//! Saving a run and resuming it, at the same or another world size and stage.
//!
//! The engine's states are saved and loaded by zero-state ([`start_save`],
//! [`load_sharded`]): every rank writes the states it owns into its own piece file, and
//! reads back exactly the element ranges it keeps under its own stage and world size. This
//! module adds the run's position (step, optimizer steps, loss scale, data-loader position,
//! model shape, configuration), which rides in the manifest's `meta`; the learning rate is
//! a function of the step and sampling is seeded, so at the same world size and stage a
//! resumed run continues to the bit. A state saved at another tensor-parallel size
//! (`--tensor-parallel-size`) is read through [`TpMap`], in whole-model coordinates.

use crate::cli::config::TrainConfig;
use crate::data::{DataLoader, LoaderState};
use crate::error::TrainError;
use serde_json::json;
use std::path::Path;
use zero::Engine;
use zero_gpt::{GptConfig, TpSplit};
use zero_state::{
    load_sharded, load_sharded_with, resolve_state_dir, start_save, Partitioning, PendingSave,
    ShardedReader,
};

use super::tp_map::TpMap;

/// Starts saving the training run: the engine's states with the run's position; written
/// in the background when `background` (see [`start_save`]).
///
/// # Errors
/// As [`start_save`].
pub fn start_state_save(
    engine: &mut Engine,
    save: &Path,
    cfg: &TrainConfig,
    model: &GptConfig,
    loader: &LoaderState,
    step: u64,
    background: bool,
) -> Result<PendingSave, TrainError> {
    let meta = json!({
        "model": model,
        "units": engine.units().len(),
        "engine_steps": engine.steps(),
        "loss_scale": engine.loss_scale(),
        "loss_scale_clean_steps": engine.loss_scaler().progress().0,
        "loss_scale_hysteresis_left": engine.loss_scaler().progress().1,
        "loader": loader,
        "config": cfg,
    });
    Ok(start_save(
        engine,
        save,
        step,
        meta,
        cfg.keep_last,
        background,
    )?)
}

/// Loads a saved run into `engine` and `loader`; returns the step to continue from.
///
/// # Errors
/// [`TrainError::Resume`] when the saved model or precision differs from this run's,
/// checkpoint errors for missing or corrupt files.
pub fn load_state(
    dir: &Path,
    model: &GptConfig,
    engine: &mut Engine,
    loader: &mut DataLoader,
) -> Result<u64, TrainError> {
    let state_dir = resolve_state_dir(dir)?;
    let bad = |reason: String| TrainError::Resume {
        dir: state_dir.clone(),
        reason,
    };
    let manifest = ShardedReader::open(&state_dir)?.manifest().clone();
    let meta = manifest.meta;
    let saved: GptConfig = serde_json::from_value(meta["model"].clone())
        .map_err(|e| bad(format!("no model shape in the state ({e})")))?;
    if saved != *model {
        return Err(bad(format!(
            "it holds {}, this run builds {}; resume with the saving run's shape flags ({})",
            shape_text(&saved),
            shape_text(model),
            saved_shape_flags(&meta["config"])
        )));
    }
    load_engine(&state_dir, &manifest.partitioning, model, engine)?;
    let step = manifest.step;
    let engine_steps = meta["engine_steps"]
        .as_u64()
        .ok_or_else(|| bad("no optimizer step count in the state".into()))?;
    // The engine counts one optimizer step per training step at most (fewer once fp16
    // overflows skip some): a larger figure is an edited or corrupt manifest.
    if engine_steps > step {
        return Err(bad(format!(
            "its engine_steps {engine_steps} exceeds its step {step}"
        )));
    }
    let loader_state: LoaderState = serde_json::from_value(meta["loader"].clone())
        .map_err(|e| bad(format!("no data loader position in the state ({e})")))?;
    // A state is saved between steps: the loader has handed out exactly `step` whole batches.
    if (loader_state.global_step, loader_state.micro_step) != (step, 0) {
        return Err(bad(format!(
            "its step is {step} but its data loader stopped at batch {} (micro-step {}): an \
             edited or corrupt manifest",
            loader_state.global_step, loader_state.micro_step
        )));
    }
    let loss_scale = meta["loss_scale"]
        .as_f64()
        .filter(|s| s.is_finite() && *s > 0.0)
        .ok_or_else(|| bad("no positive loss scale in the state".into()))?;
    engine.set_steps(engine_steps);
    // States saved before the scaler's progress was kept start it afresh.
    let counter = |key: &str, fresh: u32| {
        meta[key]
            .as_u64()
            .map_or(fresh, |n| u32::try_from(n).unwrap_or(u32::MAX))
    };
    let (clean, left) = engine.loss_scaler().progress();
    engine.set_loss_scaler(
        loss_scale as f32,
        counter("loss_scale_clean_steps", clean),
        counter("loss_scale_hysteresis_left", left),
    );
    loader.restore(&loader_state)?;
    Ok(step)
}

/// Loads the engine's states from `state_dir`, saved as `saved`: directly at the engine's
/// tensor-parallel size, through [`TpMap`] at another.
fn load_engine(
    state_dir: &Path,
    saved: &Partitioning,
    model: &GptConfig,
    engine: &mut Engine,
) -> Result<(), TrainError> {
    let split = engine
        .tensor_parallel()
        .map_or(TpSplit::NONE, |tp| TpSplit {
            size: tp.size(),
            rank: tp.rank(),
        });
    if saved.tensor_parallel == split.size {
        load_sharded(state_dir, engine)?;
    } else {
        let map = TpMap::new(model, saved, split).map_err(|reason| TrainError::Resume {
            dir: state_dir.to_path_buf(),
            reason,
        })?;
        load_sharded_with(state_dir, engine, |unit, held| map.sources(unit, held))?;
    }
    Ok(())
}

/// A model's shape as the flags name it.
fn shape_text(m: &GptConfig) -> String {
    format!(
        "L {}, NH {}, C {}, V {}, context {}",
        m.num_layers, m.num_heads, m.channels, m.vocab_size, m.max_seq_len
    )
}

/// The flags that gave the saving run (`config` of its manifest) its model shape.
fn saved_shape_flags(config: &serde_json::Value) -> String {
    let keys = [
        ("init_from", "--init-from"),
        ("model", "--model"),
        ("layers", "--layers"),
        ("heads", "--heads"),
        ("dim", "--dim"),
        ("vocab", "--vocab"),
        ("seq_len", "--seq-len"),
    ];
    let flags: Vec<String> = keys
        .iter()
        // The file of --init-from brings the shape; the preset name beside it is only the
        // default, which --model would now contradict.
        .filter(|(key, _)| *key != "model" || config["init_from"].is_null())
        .filter_map(|(key, flag)| match &config[key] {
            serde_json::Value::String(v) => Some(format!("{flag} {v}")),
            serde_json::Value::Number(v) => Some(format!("{flag} {v}")),
            _ => None,
        })
        .collect();
    if flags.is_empty() {
        "the state records none".to_string()
    } else {
        flags.join(" ")
    }
}

#[cfg(test)]
mod shape_flag_tests {
    use super::saved_shape_flags;

    #[test]
    fn the_saving_runs_shape_flags_are_named_and_nulls_skipped() {
        let config = serde_json::json!({
            "model": "tiny", "layers": null, "heads": 2, "dim": null, "vocab": null,
            "seq_len": 8, "init_from": null, "lr": 0.001
        });
        assert_eq!(
            saved_shape_flags(&config),
            "--model tiny --heads 2 --seq-len 8"
        );
        let from_file = serde_json::json!({"model": "small", "init_from": "m.bin", "seq_len": 8});
        assert_eq!(
            saved_shape_flags(&from_file),
            "--init-from m.bin --seq-len 8"
        );
        assert_eq!(
            saved_shape_flags(&serde_json::Value::Null),
            "the state records none"
        );
    }
}
