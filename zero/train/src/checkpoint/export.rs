//! `zero-train export`: one model file out of a training state or another model file.
//!
//! Sources: a saved training state (a `step-NNNNNN` folder or the `--save` directory), an
//! llm.c `model.bin` or a Hugging Face GPT-2 safetensors file. Targets: safetensors with
//! Hugging Face's names and a `config.json` beside it (read back by HF's `safetensors` package
//! in the tests; loading with `transformers` is untested), or llm.c's float32 `model.bin`. A training
//! state is streamed into safetensors one unit at a time.

use std::path::{Path, PathBuf};

use clap::{Args, ValueEnum};
use zero_gpt::{GptConfig, ParamLayout, TpSplit};

use crate::checkpoint::tp_map::TpMap;
use crate::checkpoint::{
    export_safetensors, export_sharded_safetensors, locate_model_file, read_model_file,
    write_hf_config, LlmcCheckpoint, ModelShape, SafetensorsDtype,
};
use crate::error::TrainError;
use crate::fsio::failed;
use zero_alloc::ByteSize;
use zero_state::{resolve_state_dir, ShardedReader};

/// The file formats `export` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ExportFormat {
    /// Hugging Face GPT-2 names and layouts, plus `config.json` in the same folder.
    Safetensors,
    /// llm.c's float32 `model.bin` (always fp32).
    Llmc,
}

/// Element types of a safetensors export.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ExportDtype {
    /// float32, bit-exact.
    Fp32,
    /// bfloat16, rounded to nearest even.
    Bf16,
}

/// `zero-train export`'s flags.
#[derive(Debug, Clone, Args)]
pub struct ExportArgs {
    /// A training state (`step-NNNNNN` folder or the --save directory), an llm.c model.bin,
    /// a GPT-2 safetensors file, a sharded one's `model.safetensors.index.json`, or a Hugging
    /// Face model folder holding either.
    #[arg(long)]
    pub from: PathBuf,
    /// The file to write; with `--max-shard-size`, the folder to write the shards, their
    /// `model.safetensors.index.json` and `config.json` into.
    #[arg(long)]
    pub to: PathBuf,
    /// Output format.
    #[arg(long, value_enum, default_value_t = ExportFormat::Safetensors)]
    pub format: ExportFormat,
    /// Element type of a safetensors file.
    #[arg(long, value_enum, default_value_t = ExportDtype::Fp32)]
    pub dtype: ExportDtype,
    /// Head count of a safetensors source that has no config.json beside it.
    #[arg(long)]
    pub heads: Option<usize>,
    /// Hugging Face's sharded layout: shards of at most this much tensor data (e.g. 2G,
    /// K/M/G = powers of 1024), as `save_pretrained(max_shard_size=...)` writes them.
    #[arg(long, allow_negative_numbers = true)]
    pub max_shard_size: Option<ByteSize>,
}

/// Writes the export `args` describe; returns the model it wrote.
///
/// # Errors
/// Checkpoint errors naming the file (and tensor); [`TrainError::Resume`] for a training
/// state without a model shape; `--dtype bf16` with `--format llmc` is refused.
pub fn export(args: &ExportArgs) -> Result<GptConfig, TrainError> {
    if args.format == ExportFormat::Llmc && args.dtype != ExportDtype::Fp32 {
        return Err(TrainError::Export(
            "--format llmc writes float32 only: drop --dtype".into(),
        ));
    }
    if args.format == ExportFormat::Llmc && args.max_shard_size.is_some() {
        return Err(TrainError::Export(
            "--format llmc writes one file: drop --max-shard-size".into(),
        ));
    }
    if args.max_shard_size.is_some() && args.to.is_file() {
        return Err(TrainError::Export(format!(
            "--to {} is a file; with --max-shard-size it names the folder to write the shards \
             into",
            args.to.display()
        )));
    }
    if args.max_shard_size == Some(ByteSize(0)) {
        return Err(TrainError::Export(
            "--max-shard-size 0: a shard holds at least one byte".into(),
        ));
    }
    // An export never overwrites: the file could be the model it reads, and config.json the
    // description of another model in that folder.
    // (The sharded form checks its folder when it writes it.)
    let config_json = args.to.with_file_name("config.json");
    let writes_config = args.format == ExportFormat::Safetensors;
    let one_file = [Some(&args.to), writes_config.then_some(&config_json)];
    let existing = one_file.into_iter().flatten().find(|p| p.exists());
    if let (Some(path), None) = (existing, args.max_shard_size) {
        return Err(TrainError::Export(format!(
            "{} exists: an export never overwrites; remove it or name another --to",
            path.display()
        )));
    }
    if !args.from.exists() {
        return Err(TrainError::Export(format!(
            "--from {}: no such file or folder (a training state, an llm.c model.bin, a \
             safetensors file or index, or a Hugging Face model folder)",
            args.from.display()
        )));
    }
    // A folder is a training state first; else a Hugging Face model folder; else the
    // training state's error, which says what a state folder needs.
    let state_dir = args.from.is_dir().then(|| resolve_state_dir(&args.from));
    let state_dir = match state_dir {
        Some(Err(_)) if locate_model_file(&args.from).is_ok() => None,
        other => other.transpose()?,
    };
    if let Some(dir) = state_dir {
        if args.heads.is_some() {
            return Err(TrainError::Export(
                "--heads names the head count of a safetensors file without config.json; a \
                 training state records its shape: drop --heads"
                    .into(),
            ));
        }
        let state = ShardedReader::open(dir)?;
        let model = state_model(&state, &args.from)?;
        let units = StateUnits::new(&state, &model)?;
        write(args, &model, units)?;
        Ok(model)
    } else {
        let (model, units) = read_model_file(&args.from, args.heads)?;
        write(args, &model, units.into_iter().map(Ok))?;
        Ok(model)
    }
}

/// Writes `units` (in the model's unit order) as `args` asks; the first read error of the
/// iterator stops the export and is returned.
fn write(
    args: &ExportArgs,
    model: &GptConfig,
    units: impl Iterator<Item = Result<Vec<f32>, TrainError>>,
) -> Result<(), TrainError> {
    if let Some(parent) = args.to.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(failed("create the folder", parent))?;
    }
    let mut failed = None;
    let units = units.map_while(|u| u.map_err(|e| failed = Some(e)).ok());
    let written = match args.format {
        ExportFormat::Safetensors => {
            let dtype = match args.dtype {
                ExportDtype::Fp32 => SafetensorsDtype::F32,
                ExportDtype::Bf16 => SafetensorsDtype::Bf16,
            };
            match args.max_shard_size {
                None => export_safetensors(model, units, dtype, &args.to).and_then(|()| {
                    write_hf_config(model, dtype, args.to.with_file_name("config.json"))
                }),
                Some(ByteSize(max)) => {
                    export_sharded_safetensors(model, units, dtype, &args.to, max)
                        .and_then(|files| sharded_config(model, dtype, &args.to, &files))
                }
            }
        }
        ExportFormat::Llmc => {
            let units: Vec<Vec<f32>> = units.collect();
            LlmcCheckpoint::from_units(ModelShape::from_config(model), &units)
                .and_then(|c| c.save(&args.to))
        }
    };
    // A unit that could not be read explains a short iterator better than its symptom.
    match failed {
        Some(e) => Err(e),
        None => Ok(written?),
    }
}

/// `config.json` beside the sharded export's `files`, which are removed when it cannot be
/// written (a folder of shards without a config is no model).
fn sharded_config(
    model: &GptConfig,
    dtype: SafetensorsDtype,
    dir: &Path,
    files: &[PathBuf],
) -> crate::checkpoint::Result<()> {
    let written = write_hf_config(model, dtype, dir.join("config.json"));
    if written.is_err() {
        for f in files {
            // Best effort: the config's error is the one worth reporting.
            let _ = std::fs::remove_file(f);
        }
    }
    written
}

fn state_model(state: &ShardedReader, dir: &Path) -> Result<GptConfig, TrainError> {
    let refused = |reason| TrainError::Resume {
        dir: dir.to_path_buf(),
        reason,
    };
    let model: GptConfig = serde_json::from_value(state.manifest().meta["model"].clone())
        .map_err(|e| refused(format!("no model shape in the state ({e})")))?;
    // A shape read from a file is checked before any layout is built from it.
    model
        .validate()
        .map_err(|e| refused(format!("its model shape is not a valid GPT ({e})")))?;
    Ok(model)
}

/// The whole parameters of each unit of a training state, read one at a time, in
/// whole-model (T = 1) units whatever tensor-parallel size saved it ([`TpMap`]).
struct StateUnits<'a> {
    state: &'a ShardedReader,
    map: TpMap,
    next: usize,
    units: usize,
}

impl<'a> StateUnits<'a> {
    fn new(state: &'a ShardedReader, model: &GptConfig) -> Result<Self, TrainError> {
        let map =
            TpMap::new(model, &state.manifest().partitioning, TpSplit::NONE).map_err(|reason| {
                TrainError::Resume {
                    dir: state.dir().to_path_buf(),
                    reason,
                }
            })?;
        Ok(Self {
            state,
            map,
            next: 0,
            units: ParamLayout::new(model).num_units(),
        })
    }
}

impl Iterator for StateUnits<'_> {
    type Item = Result<Vec<f32>, TrainError>;

    fn next(&mut self) -> Option<Self::Item> {
        (self.next < self.units).then(|| {
            let unit = self.next;
            self.next += 1;
            // The pieces of every rank that saved it, joined (and checksum-verified).
            let whole = 0..self.map.unit_len(unit);
            let sources =
                self.map
                    .sources(unit, whole.clone())
                    .map_err(|reason| TrainError::Resume {
                        dir: self.state.dir().to_path_buf(),
                        reason,
                    })?;
            Ok(self.state.read_mapped("params", &sources, &whole, unit)?)
        })
    }
}
