//! `--init-from`: start training from another tool's model file (llm.c's `model.bin`, a
//! Hugging Face GPT-2 safetensors file, sharded or not, or a Hugging Face model folder). The
//! file brings its own shape; shape flags, when typed, must agree with it.

use std::path::Path;

use zero::{Engine, UnitState};
use zero_gpt::{GptConfig, TpSplit};

use crate::checkpoint::tp_units::cut;
use crate::checkpoint::{model_file_config, read_model_file};
use crate::cli::config::TrainConfig;
use crate::error::{ConfigError, TrainError};

/// The model of the `--init-from` file at `path`, checked against the shape flags of `cfg`
/// (`--heads` also names the head count of a safetensors file with no `config.json`).
///
/// # Errors
/// [`ConfigError::InitFrom`] when the file cannot be read; [`ConfigError::ShapeConflict`]
/// naming the first flag that disagrees; [`ConfigError::OutOfRange`] when `--seq-len` is
/// longer than the file's context.
pub(crate) fn file_model(path: &Path, cfg: &TrainConfig) -> Result<GptConfig, ConfigError> {
    let model =
        model_file_config(path, cfg.heads).map_err(|e| ConfigError::InitFrom(Box::new(e)))?;
    let flags = [
        ("vocab", "vocab_size", cfg.vocab, model.vocab_size),
        ("layers", "num_layers", cfg.layers, model.num_layers),
        ("heads", "num_heads", cfg.heads, model.num_heads),
        ("dim", "channels", cfg.dim, model.channels),
    ];
    for (flag, field, given, found) in flags {
        if let Some(given) = given.filter(|&g| g != found) {
            return Err(ConfigError::ShapeConflict {
                flag,
                field,
                given,
                found,
                path: path.to_path_buf(),
            });
        }
    }
    if cfg.seq_len > model.max_seq_len {
        return Err(ConfigError::OutOfRange {
            key: "seq_len",
            value: cfg.seq_len.to_string(),
            expected: format!(
                "at most {}, the context length of {}",
                model.max_seq_len,
                path.display()
            ),
        });
    }
    Ok(model)
}

/// Fits the merged configuration `cfg` to its `--init-from` file, given the keys the user set
/// (`explicit`: typed flags and `--config` keys): `--seq-len`, when left at its default, is
/// cut to the file's context length; `--model`, when set, must name the file's shape.
///
/// # Errors
/// [`ConfigError::InitFrom`] when the file cannot be read; [`ConfigError::PresetConflict`];
/// [`ConfigError::Model`] for an unknown preset.
pub(crate) fn fit_to_file(cfg: &mut TrainConfig, explicit: &[String]) -> Result<(), ConfigError> {
    let Some(path) = &cfg.init_from else {
        return Ok(());
    };
    let model =
        model_file_config(path, cfg.heads).map_err(|e| ConfigError::InitFrom(Box::new(e)))?;
    let set = |key: &str| explicit.iter().any(|k| k == key);
    if set("model") {
        // The preset as the shape flags override it (each of which file_model checks).
        let preset = GptConfig::preset(&cfg.model)?;
        let asked = (
            cfg.layers.unwrap_or(preset.num_layers),
            cfg.heads.unwrap_or(preset.num_heads),
            cfg.dim.unwrap_or(preset.channels),
            cfg.vocab.unwrap_or(preset.vocab_size),
        );
        let found = (
            model.num_layers,
            model.num_heads,
            model.channels,
            model.vocab_size,
        );
        if asked != found {
            return Err(ConfigError::PresetConflict {
                preset: cfg.model.clone(),
                found: format!(
                    "--layers {} --heads {} --dim {} --vocab {}",
                    model.num_layers, model.num_heads, model.channels, model.vocab_size
                ),
                path: path.clone(),
            });
        }
    }
    if !set("seq_len") {
        cfg.seq_len = cfg.seq_len.min(model.max_seq_len);
    }
    Ok(())
}

/// Starts `engine` from the model file at `path` (fresh optimizer state); under tensor
/// parallelism, each unit of this rank cut from the file's whole units.
///
/// # Errors
/// Checkpoint errors naming the file; [`TrainError::Resume`] if the file's model is not
/// `model` (the file changed since the configuration was checked).
pub fn load_init(path: &Path, model: &GptConfig, engine: &mut Engine) -> Result<(), TrainError> {
    let (found, units) = read_model_file(path, Some(model.num_heads))?;
    if found != *model {
        return Err(TrainError::Resume {
            dir: path.to_path_buf(),
            reason: format!("it holds a model of shape {found:?}, this run builds {model:?}"),
        });
    }
    // At T > 1 this rank's units are cut from the whole ones.
    let units = match engine.tensor_parallel() {
        None => units,
        Some(tp) => {
            let split = TpSplit {
                size: tp.size(),
                rank: tp.rank(),
            };
            (0..engine.units().len())
                .map(|unit| cut(model, split, unit, &units))
                .collect::<Result<_, _>>()?
        }
    };
    let states: Vec<UnitState> = units
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
