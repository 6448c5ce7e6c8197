//! `zero-train`'s configuration: command-line flags over a TOML file over defaults.
//!
//! The flags and the file share one struct ([`TrainArgs`], every field optional) so a key in
//! the file is spelled exactly like its flag (`--micro-batch-size` / `micro_batch_size`), with
//! DeepSpeed's names accepted as aliases where its users would reach for them (`stage`,
//! `train_batch_size`, `prefetch`, ...). Layers are merged as JSON maps (flags win, then the
//! file, then [`TrainConfig::default`]) rather than field by field, so adding a knob means
//! adding it in two places: here and in `TrainConfig`.

use super::bytesize::ByteSize;
use clap::{Args, ValueEnum};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use zero::ZeroStage;

/// Where collectives run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// Ranks as threads of this process (the default).
    Local,
    /// One process per rank under `mpirun` (feature `mpi`).
    Mpi,
    /// One GPU per rank (feature `cuda`).
    Nccl,
}

/// Storage precision of parameters and gradients.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum PrecisionArg {
    /// 4-byte parameters and gradients.
    Fp32,
    /// 2-byte bfloat16 parameters and gradients, fp32 master weights and moments.
    Bf16,
    /// 2-byte float16 with dynamic loss scaling, fp32 master weights and moments.
    Fp16,
}

impl From<PrecisionArg> for zero::Precision {
    fn from(p: PrecisionArg) -> Self {
        match p {
            PrecisionArg::Fp32 => Self::Fp32,
            PrecisionArg::Bf16 => Self::Bf16,
            PrecisionArg::Fp16 => Self::Fp16,
        }
    }
}

/// Every knob of a training run, each optional: parsed from flags or from a TOML file.
#[derive(Debug, Clone, Default, Args, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainArgs {
    /// TOML file whose keys match these flags (flags given on the command line win).
    #[arg(long)]
    #[serde(skip)]
    pub config: Option<PathBuf>,

    /// Model preset: tiny, small, gpt2, gpt2-medium, gpt2-large, gpt2-xl.
    #[arg(long)]
    pub model: Option<String>,
    /// Number of transformer blocks (overrides the preset).
    #[arg(long)]
    pub layers: Option<usize>,
    /// Attention heads per block (overrides the preset).
    #[arg(long)]
    pub heads: Option<usize>,
    /// Channels, the model width (overrides the preset).
    #[arg(long)]
    pub dim: Option<usize>,
    /// Vocabulary size before padding (overrides the preset).
    #[arg(long)]
    pub vocab: Option<usize>,
    /// Sequence length of a training sample.
    #[arg(long)]
    pub seq_len: Option<usize>,

    /// Directory holding train.bin and val.bin (llm.c token files).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Number of data-parallel ranks (local backend; MPI takes it from mpirun).
    #[arg(long)]
    pub world_size: Option<usize>,
    /// Collective backend.
    #[arg(long, value_enum)]
    pub backend: Option<Backend>,
    /// Compute device: cpu or cuda.
    #[arg(long)]
    pub device: Option<String>,

    /// Optimizer steps to run.
    #[arg(long)]
    pub steps: Option<u64>,
    /// Global batch in sequences per optimizer step (DeepSpeed's train_batch_size).
    #[arg(long)]
    #[serde(alias = "train_batch_size")]
    pub batch_size: Option<usize>,
    /// Sequences per rank per forward pass; gradient accumulation makes up the global batch.
    #[arg(long)]
    #[serde(alias = "train_micro_batch_size_per_gpu")]
    pub micro_batch_size: Option<usize>,
    /// Peak learning rate.
    #[arg(long)]
    pub lr: Option<f32>,
    /// Linear warm-up steps before cosine decay.
    #[arg(long)]
    pub warmup_steps: Option<u64>,
    /// Final learning rate as a fraction of the peak.
    #[arg(long)]
    pub min_lr_ratio: Option<f32>,
    /// Decoupled weight decay (matrices only).
    #[arg(long)]
    pub weight_decay: Option<f32>,
    /// Global gradient-norm clipping threshold (0 turns clipping off).
    #[arg(long)]
    #[serde(alias = "gradient_clipping")]
    pub grad_clip: Option<f32>,
    /// Storage precision of parameters and gradients.
    #[arg(long, value_enum)]
    pub precision: Option<PrecisionArg>,
    /// Seed of initialisation, data order and sampling.
    #[arg(long)]
    pub seed: Option<u64>,

    /// Steps between validation-loss evaluations (0 turns evaluation off).
    #[arg(long)]
    pub eval_every: Option<u64>,
    /// Validation batches per evaluation.
    #[arg(long)]
    pub eval_batches: Option<usize>,
    /// Tokens to sample from the model at the end (0 turns sampling off).
    #[arg(long)]
    pub sample_tokens: Option<usize>,
    /// Top-k of the final sample.
    #[arg(long)]
    pub top_k: Option<usize>,

    /// Directory to save states into, as `step-NNNNNN` folders (resumable with --resume).
    #[arg(long)]
    pub save: Option<PathBuf>,
    /// Steps between saves besides the final one (0: only at the end).
    #[arg(long)]
    pub save_every: Option<u64>,
    /// A saved `step-NNNNNN` folder to continue from, or the --save directory (its latest).
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// llm.c float32 checkpoint (model.bin format) to start from instead of a random init.
    #[arg(long)]
    pub init_from: Option<PathBuf>,
    /// Write the final parameters as an llm.c float32 checkpoint.
    #[arg(long)]
    pub export_llmc: Option<PathBuf>,
    /// File to write JSON-lines metrics into.
    #[arg(long)]
    pub metrics: Option<PathBuf>,

    /// ZeRO stage: 0 (data parallel), 1 (optimizer states), 2 (+gradients), 3 (+parameters).
    #[arg(long)]
    #[serde(alias = "stage")]
    pub zero_stage: Option<u8>,
    /// Bytes per gradient bucket for the reduction during backward.
    #[arg(long)]
    pub reduce_bucket_size: Option<ByteSize>,
    /// Units gathered ahead of the one computing (stage 3).
    #[arg(long)]
    #[serde(alias = "prefetch")]
    pub prefetch_units: Option<usize>,
    /// Units with fewer elements stay whole on every rank (stage 3).
    #[arg(long)]
    pub param_persistence_threshold: Option<usize>,
    /// Cap on each rank's arena, emulating a device of that size (e.g. 16G).
    #[arg(long)]
    pub memory_limit: Option<ByteSize>,
}

/// A complete, validated training configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[allow(missing_docs)] // each field is documented on its flag in `TrainArgs`
pub struct TrainConfig {
    pub model: String,
    pub layers: Option<usize>,
    pub heads: Option<usize>,
    pub dim: Option<usize>,
    pub vocab: Option<usize>,
    pub seq_len: usize,
    pub data: PathBuf,
    pub world_size: usize,
    pub backend: Backend,
    pub device: String,
    pub steps: u64,
    pub batch_size: usize,
    pub micro_batch_size: usize,
    pub lr: f32,
    pub warmup_steps: u64,
    pub min_lr_ratio: f32,
    pub weight_decay: f32,
    pub grad_clip: f32,
    pub precision: PrecisionArg,
    pub seed: u64,
    pub eval_every: u64,
    pub eval_batches: usize,
    pub sample_tokens: usize,
    pub top_k: usize,
    pub save: Option<PathBuf>,
    pub save_every: u64,
    pub resume: Option<PathBuf>,
    pub init_from: Option<PathBuf>,
    pub export_llmc: Option<PathBuf>,
    pub metrics: Option<PathBuf>,
    pub zero_stage: u8,
    pub reduce_bucket_size: ByteSize,
    pub prefetch_units: usize,
    pub param_persistence_threshold: usize,
    pub memory_limit: Option<ByteSize>,
}

impl Default for TrainConfig {
    /// The README's main job: a small model on Shakespeare, two ranks, ZeRO stage 2.
    fn default() -> Self {
        Self {
            model: "small".into(),
            layers: None,
            heads: None,
            dim: None,
            vocab: None,
            seq_len: 64,
            data: PathBuf::from("data/shakespeare"),
            world_size: 2,
            backend: Backend::Local,
            device: "cpu".into(),
            steps: 200,
            batch_size: 8,
            micro_batch_size: 4,
            lr: 1e-3,
            warmup_steps: 20,
            min_lr_ratio: 0.1,
            weight_decay: 0.1,
            grad_clip: 1.0,
            precision: PrecisionArg::Fp32,
            seed: 1337,
            eval_every: 50,
            eval_batches: 8,
            sample_tokens: 64,
            top_k: 40,
            save: None,
            save_every: 0,
            resume: None,
            init_from: None,
            export_llmc: None,
            metrics: None,
            zero_stage: 2,
            reduce_bucket_size: ByteSize(4 << 20),
            prefetch_units: 1,
            param_persistence_threshold: 0,
            memory_limit: None,
        }
    }
}

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The config file is not valid TOML for these keys.
    #[error("config file {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message, with the line.
        message: String,
    },
    /// A value is out of range or inconsistent with another.
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

impl TrainArgs {
    /// Reads a TOML file of flags (unknown keys are errors, so typos do not pass silently).
    ///
    /// # Errors
    /// [`ConfigError::Read`] or [`ConfigError::Parse`].
    pub fn from_toml_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        toml::from_str(&text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        })
    }

    /// Flags over the `--config` file (if any) over defaults, validated.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the file or the inconsistent values.
    pub fn resolve(&self) -> Result<TrainConfig, ConfigError> {
        let file = match &self.config {
            Some(path) => Self::from_toml_file(path)?,
            None => TrainArgs::default(),
        };
        let mut merged = to_map(&TrainConfig::default())?;
        merged.extend(to_map(&file)?);
        merged.extend(to_map(self)?);
        let config: TrainConfig = serde_json::from_value(serde_json::Value::Object(merged))
            .map_err(|e| ConfigError::Invalid(e.to_string()))?;
        config.validate()?;
        Ok(config)
    }
}

/// Serializes `value` to a JSON map without its unset (`null`) entries.
fn to_map<T: Serialize>(
    value: &T,
) -> Result<serde_json::Map<String, serde_json::Value>, ConfigError> {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::Object(mut map)) => {
            map.retain(|_, v| !v.is_null());
            Ok(map)
        }
        Ok(other) => Err(ConfigError::Invalid(format!(
            "expected a table, got {other}"
        ))),
        Err(e) => Err(ConfigError::Invalid(e.to_string())),
    }
}

impl TrainConfig {
    /// The ZeRO stage as the engine's type.
    pub fn stage(&self) -> ZeroStage {
        // `validate` has checked the range; stage 0 is the safe reading of anything else.
        ZeroStage::from_index(self.zero_stage).unwrap_or(ZeroStage::Zero0)
    }

    /// Micro-steps per optimizer step on each rank.
    pub fn grad_accum_steps(&self) -> usize {
        self.batch_size / (self.micro_batch_size * self.world_size).max(1)
    }

    /// Checks ranges and the relations between values.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] saying which value is wrong and what would be right.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |msg: String| Err(ConfigError::Invalid(msg));
        if ZeroStage::from_index(self.zero_stage).is_none() {
            return bad(format!(
                "zero_stage is {}; it must be 0, 1, 2 or 3",
                self.zero_stage
            ));
        }
        if self.world_size == 0 || self.micro_batch_size == 0 || self.batch_size == 0 {
            return bad("world_size, batch_size and micro_batch_size must be at least 1".into());
        }
        if self.seq_len == 0 {
            return bad("seq_len must be at least 1".into());
        }
        let per_micro_step = self.micro_batch_size * self.world_size;
        if self.batch_size % per_micro_step != 0 {
            return bad(format!(
                "batch_size {} is not a multiple of micro_batch_size {} x world_size {} = {}",
                self.batch_size, self.micro_batch_size, self.world_size, per_micro_step
            ));
        }
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return bad(format!("lr must be a positive number, got {}", self.lr));
        }
        if !(0.0..=1.0).contains(&self.min_lr_ratio) {
            return bad(format!(
                "min_lr_ratio must be in [0, 1], got {}",
                self.min_lr_ratio
            ));
        }
        if !(self.grad_clip >= 0.0 && self.weight_decay >= 0.0) {
            return bad("grad_clip and weight_decay must be non-negative".into());
        }
        if self.top_k == 0 && self.sample_tokens > 0 {
            return bad("top_k must be at least 1 to sample".into());
        }
        if self.reduce_bucket_size.0 == 0 {
            return bad("reduce_bucket_size must be at least 1 byte".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: TrainArgs,
    }

    fn parse(flags: &[&str]) -> TrainArgs {
        Cli::try_parse_from(std::iter::once("zero-train").chain(flags.iter().copied()))
            .unwrap()
            .args
    }

    fn write_toml(text: &str) -> (tempdir::Dir, PathBuf) {
        let dir = tempdir::Dir::new();
        let path = dir.path().join("run.toml");
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    /// A throwaway directory removed on drop (std only, to keep dev-dependencies small).
    mod tempdir {
        pub struct Dir(std::path::PathBuf);
        impl Dir {
            pub fn new() -> Self {
                use std::sync::atomic::{AtomicUsize, Ordering};
                static N: AtomicUsize = AtomicUsize::new(0);
                let p = std::env::temp_dir().join(format!(
                    "zero-config-test-{}-{}",
                    std::process::id(),
                    N.fetch_add(1, Ordering::Relaxed)
                ));
                std::fs::create_dir_all(&p).unwrap();
                Self(p)
            }
            pub fn path(&self) -> &std::path::Path {
                &self.0
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    #[test]
    fn no_flags_give_the_defaults() {
        assert_eq!(parse(&[]).resolve().unwrap(), TrainConfig::default());
    }

    #[test]
    fn flags_override_the_file_which_overrides_defaults() {
        let (_dir, path) =
            write_toml("steps = 7\nlr = 0.01\nstage = 3\nreduce_bucket_size = \"2M\"\n");
        let p = path.to_str().unwrap();
        let cfg = parse(&["--config", p, "--lr", "0.5"]).resolve().unwrap();
        assert_eq!(cfg.steps, 7);
        assert_eq!(cfg.lr, 0.5);
        assert_eq!(cfg.stage(), ZeroStage::Zero3);
        assert_eq!(cfg.reduce_bucket_size, ByteSize(2 << 20));
        assert_eq!(cfg.seed, TrainConfig::default().seed);
    }

    #[test]
    fn memory_limit_accepts_suffixes_on_the_command_line() {
        let cfg = parse(&["--memory-limit", "16G"]).resolve().unwrap();
        assert_eq!(cfg.memory_limit, Some(ByteSize(16 << 30)));
    }

    #[test]
    fn a_misspelled_key_names_itself() {
        let (_dir, path) = write_toml("stpes = 7\n");
        let err = parse(&["--config", path.to_str().unwrap()])
            .resolve()
            .unwrap_err();
        assert!(matches!(err, ConfigError::Parse { .. }));
        assert!(err.to_string().contains("stpes"), "{err}");
    }

    #[test]
    fn a_missing_file_is_named() {
        let err = parse(&["--config", "/nonexistent/run.toml"])
            .resolve()
            .unwrap_err();
        assert!(err.to_string().contains("/nonexistent/run.toml"), "{err}");
    }

    #[test]
    fn an_uneven_batch_is_refused_with_the_arithmetic() {
        let err = parse(&[
            "--batch-size",
            "10",
            "--micro-batch-size",
            "4",
            "--world-size",
            "2",
        ])
        .resolve()
        .unwrap_err();
        assert!(err.to_string().contains("4 x world_size 2 = 8"), "{err}");
    }

    #[test]
    fn stage_four_is_refused() {
        assert!(parse(&["--zero-stage", "4"]).resolve().is_err());
    }

    #[test]
    fn accumulation_fills_the_global_batch() {
        let cfg = parse(&[
            "--batch-size",
            "32",
            "--micro-batch-size",
            "2",
            "--world-size",
            "4",
        ])
        .resolve()
        .unwrap();
        assert_eq!(cfg.grad_accum_steps(), 4);
    }
}
