//! `zero-train`'s configuration: one struct, [`TrainConfig`], that is at once the command
//! line (clap), the `--config` TOML file (serde) and the run's settings.
//!
//! Each field is declared once, with its flag, its default (shown by `--help`) and its
//! DeepSpeed alias where its users would reach for one (`stage`, `train_batch_size`,
//! `prefetch`, ...). A key in the file is spelled like its flag (`--micro-batch-size` /
//! `micro_batch_size`); unknown keys are errors. [`crate::TrainArgs`] layers flags over the
//! file over the defaults, and [`TrainConfig::validate`] checks every value's range.

use clap::{Args, FromArgMatches, ValueEnum};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use zero::optim::AdamW;
use zero::{EngineConfig, KeptInputs, ZeroStage};
use zero_alloc::ByteSize;
use zero_gpt::GptConfig;

use crate::error::ConfigError;

/// Where collectives run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// Ranks as threads of this process.
    Local,
    /// One process per rank under `mpirun` (feature `mpi`).
    Mpi,
    /// One process per rank on the host, joined over TCP through rank 0 (zero-comm's `tcp`),
    /// launched by torchrun or anything that sets `RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
    /// `MASTER_ADDR` and `MASTER_PORT`.
    Tcp,
    /// One GPU per rank, one process per rank (feature `cuda`), launched torchrun-style (the
    /// engine's control traffic over TCP) or by `mpirun` (feature `mpi`: over MPI).
    Nccl,
}

/// Where the model's kernels run, as `--device` spells it: `cpu`, `cuda` or `cuda:N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    /// The host's cores.
    Cpu,
    /// CUDA (feature `cuda`): GPU N when given; otherwise the ranks of this process share GPU
    /// 0 (local backend), or each process drives the GPU of its local rank (nccl backend).
    Cuda(Option<usize>),
}

impl Device {
    /// True for `cuda` and `cuda:N`.
    #[must_use]
    pub fn is_cuda(self) -> bool {
        matches!(self, Self::Cuda(_))
    }

    /// The GPU asked for by `cuda:N`, else `default` (GPU 0, or the local rank).
    #[must_use]
    pub fn ordinal_or(self, default: usize) -> usize {
        match self {
            Self::Cuda(Some(n)) => n,
            _ => default,
        }
    }
}

/// Most GPUs one machine is taken to have (an ordinal past it is a typo).
const MAX_GPU_ORDINAL: usize = 1 << 16;

impl std::str::FromStr for Device {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let bad = || format!("{text:?} is not a device: expected cpu, cuda or cuda:N");
        match text.trim() {
            "cpu" => Ok(Self::Cpu),
            "cuda" => Ok(Self::Cuda(None)),
            other => {
                let digits = other.strip_prefix("cuda:").ok_or_else(bad)?;
                if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(bad());
                }
                match digits.parse::<usize>() {
                    Ok(n) if n < MAX_GPU_ORDINAL => Ok(Self::Cuda(Some(n))),
                    _ => Err(format!(
                        "{text:?}: the GPU ordinal must be below {MAX_GPU_ORDINAL}"
                    )),
                }
            }
        }
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Cpu => f.write_str("cpu"),
            Self::Cuda(None) => f.write_str("cuda"),
            Self::Cuda(Some(n)) => write!(f, "cuda:{n}"),
        }
    }
}

impl Serialize for Device {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Device {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
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

/// Every knob of a training run: its flags, its TOML keys and its values. An on/off flag is
/// on when given alone (`--offload-optimizer`) and takes `=false` to turn off what a
/// `--config` file turned on.
#[derive(Debug, Clone, PartialEq, Args, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainConfig {
    /// Model preset: tiny, small, gpt2, gpt2-medium, gpt2-large, gpt2-xl.
    #[arg(long, default_value = "small")]
    pub model: String,
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
    #[arg(long, allow_negative_numbers = true, default_value_t = 64)]
    pub seq_len: usize,

    /// Directory holding train.bin and val.bin (llm.c token files).
    #[arg(long, default_value = "data/shakespeare")]
    pub data: PathBuf,
    /// Number of data-parallel ranks (local backend; the other backends take it from their
    /// launcher: mpirun's world, or `WORLD_SIZE`).
    #[arg(long, allow_negative_numbers = true, default_value_t = 2)]
    pub world_size: usize,
    /// Megatron tensor parallelism: ranks per tensor-parallel group (T), each splitting the
    /// blocks' matrices; ZeRO runs over the world_size / T data-parallel ranks. T must
    /// divide the world size and the heads; 1 is none. CPU only, and for now without
    /// checkpoints, exports, `--init-from`, `--offload-optimizer`, faults or fingerprints.
    /// `zero-train plan` plans one rank of the split model.
    #[arg(long, allow_negative_numbers = true, default_value_t = 1)]
    pub tensor_parallel_size: usize,
    /// Collective backend.
    #[arg(long, value_enum, default_value_t = Backend::Local)]
    pub backend: Backend,
    /// Compute device: cpu, cuda (the local backend's ranks share GPU 0; under nccl each
    /// process drives its local rank's GPU) or cuda:N (GPU N).
    #[arg(long, default_value = "cpu")]
    pub device: Device,
    /// Seconds a rank waits for its peers (to join, or at a collective) before failing.
    #[arg(long, allow_negative_numbers = true, default_value_t = 600)]
    pub comm_timeout: u64,
    /// Follow every collective whose result all ranks hold whole with a comparison of the
    /// result's hash across ranks, and fail naming the ranks that differ (docs/faults.md).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value_t = false, action = clap::ArgAction::Set)]
    pub comm_checksums: bool,
    /// Steps between cross-rank fingerprints of the parameters every rank holds whole: a hash
    /// all-gathered, so a rank whose copy silently diverged is named (0 turns it off).
    #[arg(long, allow_negative_numbers = true, default_value_t = 0)]
    pub fingerprint_every: u64,
    /// A fault injected on purpose, KIND:rank=R,step=S[,op=NAME][,seq=N][,attempt=K] with
    /// KIND kill, hang, slow=MS, corrupt or diverge (repeatable; also ZERO_INJECT_FAULT,
    /// `;`-separated; docs/faults.md).
    #[arg(long, allow_hyphen_values = true)]
    pub inject_fault: Vec<crate::run::fault::FaultSpec>,

    /// Optimizer steps to run.
    #[arg(long, allow_negative_numbers = true, default_value_t = 200)]
    pub steps: u64,
    /// Global batch in sequences per optimizer step (DeepSpeed's train_batch_size). Left
    /// out: micro-batch x world size with --backend local (8 for the defaults); launched
    /// ranks take 8.
    #[arg(long, allow_negative_numbers = true, default_value_t = 8)]
    #[serde(alias = "train_batch_size")]
    pub batch_size: usize,
    /// Sequences per rank per forward pass; gradient accumulation makes up the global batch.
    #[arg(long, allow_negative_numbers = true, default_value_t = 4)]
    #[serde(alias = "train_micro_batch_size_per_gpu")]
    pub micro_batch_size: usize,
    /// Peak learning rate.
    #[arg(long, allow_negative_numbers = true, default_value_t = 1e-3)]
    pub lr: f32,
    /// Linear warm-up steps before cosine decay.
    #[arg(long, allow_negative_numbers = true, default_value_t = 20)]
    pub warmup_steps: u64,
    /// Final learning rate as a fraction of the peak.
    #[arg(long, allow_negative_numbers = true, default_value_t = 0.1)]
    pub min_lr_ratio: f32,
    /// Decoupled weight decay (matrices only).
    #[arg(long, allow_negative_numbers = true, default_value_t = 0.1)]
    pub weight_decay: f32,
    /// Global gradient-norm clipping threshold (0 turns clipping off).
    #[arg(long, allow_negative_numbers = true, default_value_t = 1.0)]
    #[serde(alias = "gradient_clipping")]
    pub grad_clip: f32,
    /// Storage precision of parameters and gradients.
    #[arg(long, value_enum, default_value_t = PrecisionArg::Fp32)]
    pub precision: PrecisionArg,
    /// Seed of initialisation, data order and sampling.
    #[arg(long, allow_negative_numbers = true, default_value_t = 1337)]
    pub seed: u64,

    /// Steps between validation-loss evaluations (0 turns evaluation off).
    #[arg(long, allow_negative_numbers = true, default_value_t = 50)]
    pub eval_every: u64,
    /// Validation batches per evaluation.
    #[arg(long, allow_negative_numbers = true, default_value_t = 8)]
    pub eval_batches: usize,
    /// Tokens to sample from the model at the end (0 turns sampling off).
    #[arg(long, allow_negative_numbers = true, default_value_t = 64)]
    pub sample_tokens: usize,
    /// Top-k of the final sample.
    #[arg(long, allow_negative_numbers = true, default_value_t = 40)]
    pub top_k: usize,

    /// Directory to save states into, as `step-NNNNNN` folders (resumable with --resume).
    #[arg(long)]
    pub save: Option<PathBuf>,
    /// Steps between saves besides the final one (0: only at the end).
    #[arg(long, allow_negative_numbers = true, default_value_t = 0)]
    pub save_every: u64,
    /// Complete states kept in the --save directory, newest first; older ones are removed
    /// once a new one is published (0 keeps all).
    #[arg(long, allow_negative_numbers = true, default_value_t = 0)]
    pub keep_last: usize,
    /// Write each save's pieces on a background thread from a copy of the rank's shards
    /// while training goes on; the next save (and the final one, always in the foreground)
    /// waits for it and reports its errors.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value_t = false, action = clap::ArgAction::Set)]
    pub async_save: bool,
    /// A saved `step-NNNNNN` folder to continue from, or the --save directory (the state
    /// its `latest` file names, else its highest complete step).
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// Model file to start from instead of a random init: an llm.c float32 model.bin, a
    /// Hugging Face GPT-2 safetensors file or a sharded one's model.safetensors.index.json
    /// (config.json beside it), or a Hugging Face model folder; the shape comes from the file
    /// (and --seq-len's default is cut to its context). With --resume the file only names
    /// the shape: the weights are the state's.
    #[arg(long)]
    pub init_from: Option<PathBuf>,
    /// Write the final parameters as an llm.c float32 checkpoint.
    #[arg(long)]
    pub export_llmc: Option<PathBuf>,
    /// File to write JSON-lines metrics into.
    #[arg(long)]
    pub metrics: Option<PathBuf>,
    /// File to write a timeline of the first --trace-steps steps into, as Chrome trace JSON
    /// (open it in ui.perfetto.dev or chrome://tracing): each model operation, engine call,
    /// kept-input copy and optimizer step of every rank. Ranks in other processes (mpi, tcp,
    /// nccl) write FILE with `.rankN` before its extension.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Steps the --trace timeline records, from the first step the run takes.
    #[arg(long, allow_negative_numbers = true, default_value_t = 3)]
    pub trace_steps: u64,

    /// ZeRO stage: 0 (data parallel), 1 (optimizer states), 2 (+gradients), 3 (+parameters).
    #[arg(long, default_value = "2", value_parser = parse_stage)]
    #[serde(alias = "stage", with = "stage_index")]
    pub zero_stage: ZeroStage,
    /// Bytes per gradient bucket for the reduction during backward (K/M/G suffixes).
    #[arg(long, default_value = "4M", allow_negative_numbers = true)]
    pub reduce_bucket_size: ByteSize,
    /// Units gathered ahead of the one computing (stage 3); at most the model's units.
    #[arg(long, allow_negative_numbers = true, default_value_t = 1)]
    #[serde(alias = "prefetch")]
    pub prefetch_units: usize,
    /// Units with fewer elements stay whole on every rank (stage 3).
    #[arg(long, allow_negative_numbers = true, default_value_t = 0)]
    pub param_persistence_threshold: usize,
    /// Cap on each rank's arena, emulating a device of that size (e.g. 16G).
    #[arg(long, allow_negative_numbers = true)]
    pub memory_limit: Option<ByteSize>,
    /// Turns memory defragmentation (the paper's MD) off: an allocation that finds no hole
    /// large enough then fails instead of compacting the arena (to see what MD buys).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value_t = false, action = clap::ArgAction::Set)]
    pub no_defragment: bool,
    /// ZeRO-R activation checkpointing: keep only every K-th block's input in forward and
    /// recompute the blocks in backward (K = `--checkpoint-every`).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value_t = false, action = clap::ArgAction::Set)]
    pub activation_checkpointing: bool,
    /// Blocks per checkpointed segment (K) with `--activation-checkpointing`.
    #[arg(long, allow_negative_numbers = true, default_value_t = 1, value_parser = clap::value_parser!(usize))]
    pub checkpoint_every: usize,
    /// With `--activation-checkpointing`: keep the block inputs in pinned host memory,
    /// copied out and fetched back ahead of their recompute on a copy thread; the rank's
    /// arena keeps two staging slots of one input each.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value_t = false, action = clap::ArgAction::Set)]
    pub offload_activations: bool,
    /// ZeRO-R's P_a, with `--activation-checkpointing` and `--tensor-parallel-size` T > 1:
    /// each rank of a tensor-parallel group keeps a 1/T slice of each kept block input
    /// (padded to T slices), all-gathered over the group one block ahead of its recompute;
    /// with `--offload-activations` the slices go to pinned host memory.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value_t = false, action = clap::ArgAction::Set)]
    pub partition_activations: bool,
    /// ZeRO-Offload: keep the f32 master weights and Adam's moments off the device and run
    /// AdamW on the host: `cpu` (alone: `--offload-optimizer`) in a host arena (page-locked
    /// with `--device cuda`), `nvme` in one file per rank under `--nvme-path`, streamed
    /// through the host piece by piece; `false` turns it off. The device keeps the stored
    /// parameters and gradients. `--memory-limit` caps the device's arena only.
    #[arg(long, num_args = 0..=1, default_missing_value = "cpu", default_value = "false", value_parser = OffloadTier::parse, action = clap::ArgAction::Set)]
    #[serde(with = "offload_tier")]
    pub offload_optimizer: OffloadTier,
    /// ZeRO-Infinity's parameter offload, at `--zero-stage 3` with `--offload-optimizer`:
    /// keep each rank's stored parameter shards off the device: `cpu` (alone:
    /// `--offload-params`) in a host arena, `nvme` in one file per rank under
    /// `--nvme-path`. Each shard is copied into its all-gather's buffer when the gather is
    /// launched (`--prefetch-units` ahead), and the host update writes it back; units under
    /// `--param-persistence-threshold` stay on the device. `false` turns it off.
    #[arg(long, num_args = 0..=1, default_missing_value = "cpu", default_value = "false", value_parser = OffloadTier::parse, action = clap::ArgAction::Set)]
    #[serde(with = "offload_tier")]
    pub offload_params: OffloadTier,
    /// DeepSpeed's delayed parameter update, with `--offload-optimizer` (cpu or nvme): each
    /// step's host AdamW (and with nvme its file's reads and writes) runs on a thread while
    /// the next step's forward and backward run on the parameters of the step before (one
    /// step stale: not the numbers of a run without it). A save, an export and the run's
    /// last step land the pending update first.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value_t = false, action = clap::ArgAction::Set)]
    pub delayed_param_update: bool,
    /// With `--offload-optimizer` (cpu or nvme): keep the reduced gradients each rank keeps
    /// in the host arena too, accumulated there as each bucket's reduction lands during
    /// backward, as DeepSpeed's ZeRO-Offload does, so the device's arena holds no gradient
    /// between steps and the host update reads them in place (beside
    /// `--delayed-param-update`, in a host arena of their own, copied to the update's
    /// thread at each step). On a GPU each landed bucket is copied to the host first (not
    /// run on a GPU yet).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value_t = false, action = clap::ArgAction::Set)]
    pub offload_gradients: bool,
    /// With `--offload-params nvme`: bytes of parameter shards each rank's I/O thread reads
    /// ahead of their gathers, in the order of the model's program (at least the largest
    /// shard, at most all of them; K/M/G suffixes); a full budget waits, never fails.
    #[arg(long, default_value = "64M", allow_negative_numbers = true)]
    pub nvme_prefetch_bytes: ByteSize,
    /// The folder of the `nvme` tier's files (`--offload-optimizer nvme`,
    /// `--offload-params nvme`; one file per rank and tier, created at start-up, replaced if
    /// present): an existing, writable directory, ideally on a fast disk.
    #[arg(long)]
    pub nvme_path: Option<PathBuf>,
    /// Cap on each rank's host memory of the offloaded tiers (the optimizer's host arena
    /// and, with `--offload-params cpu`, the parameter shards'), e.g. 64M; refused at
    /// start-up below what the run needs, with the bytes needed.
    #[arg(long, allow_negative_numbers = true)]
    pub host_memory_limit: Option<ByteSize>,
}

/// Where `--offload-optimizer` puts the optimizer states, and `--offload-params` the
/// parameter shards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OffloadTier {
    /// In the rank's arena, beside the other model states.
    #[default]
    Off,
    /// In a host arena.
    Cpu,
    /// In one file per rank under `--nvme-path`, streamed through the host arena.
    Nvme,
}

impl OffloadTier {
    /// Offloaded at all (`cpu` or `nvme`).
    #[must_use]
    pub fn is_on(self) -> bool {
        self != Self::Off
    }

    /// Where the tier puts what it offloads, in words (`None` when off).
    #[must_use]
    pub fn place(self) -> Option<&'static str> {
        match self {
            Self::Off => None,
            Self::Cpu => Some("the host"),
            Self::Nvme => Some("files"),
        }
    }

    /// Parses `cpu`, `nvme`, `true` (cpu) or `false` (off).
    ///
    /// # Errors
    /// Any other word, named.
    pub fn parse(text: &str) -> Result<Self, String> {
        match text.trim() {
            "cpu" | "true" => Ok(Self::Cpu),
            "nvme" => Ok(Self::Nvme),
            "false" => Ok(Self::Off),
            other => Err(format!(
                "{other:?} is not an offload tier: expected cpu, nvme, true (cpu) or false"
            )),
        }
    }
}

/// `offload_optimizer` and `offload_params` in TOML: `true` / `false` (cpu / off), or
/// `"cpu"` / `"nvme"`.
mod offload_tier {
    use super::OffloadTier;
    use serde::{de::Error, Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(tier: &OffloadTier, s: S) -> Result<S::Ok, S::Error> {
        match tier {
            OffloadTier::Off => s.serialize_bool(false),
            OffloadTier::Cpu => s.serialize_str("cpu"),
            OffloadTier::Nvme => s.serialize_str("nvme"),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<OffloadTier, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Given {
            Flag(bool),
            Word(String),
        }
        match Given::deserialize(d)? {
            Given::Flag(on) => Ok(if on {
                OffloadTier::Cpu
            } else {
                OffloadTier::Off
            }),
            Given::Word(word) => OffloadTier::parse(&word).map_err(D::Error::custom),
        }
    }
}

impl Default for TrainConfig {
    /// The README's main job: a small model on Shakespeare, two ranks, ZeRO stage 2; the
    /// values are the `default_value` attributes above, read through clap so they exist once.
    fn default() -> Self {
        let command = Self::augment_args(clap::Command::new("zero-train"));
        let defaults = command
            .try_get_matches_from(["zero-train"])
            .and_then(|matches| Self::from_arg_matches(&matches));
        // Only the attributes above reach this parse; `no_flags_give_the_defaults` runs it.
        defaults.unwrap_or_else(|e| unreachable!("zero-train's default values parse: {e}"))
    }
}

/// Parses `--zero-stage`: 0, 1, 2 or 3.
fn parse_stage(text: &str) -> Result<ZeroStage, String> {
    text.trim()
        .parse::<u8>()
        .ok()
        .and_then(ZeroStage::from_index)
        .ok_or_else(|| format!("{text:?} is not a ZeRO stage: expected 0, 1, 2 or 3"))
}

/// The stage as its number in TOML files, checkpoints and metrics (`zero_stage = 3`).
mod stage_index {
    use serde::{de::Error, Deserialize, Deserializer, Serializer};
    use zero::ZeroStage;

    pub fn serialize<S: Serializer>(stage: &ZeroStage, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u8(*stage as u8)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<ZeroStage, D::Error> {
        let n = i64::deserialize(d)?;
        u8::try_from(n)
            .ok()
            .and_then(ZeroStage::from_index)
            .ok_or_else(|| D::Error::custom(format!("zero_stage {n}: expected 0, 1, 2 or 3")))
    }
}

impl TrainConfig {
    /// Blocks per checkpointed segment, or `None` without activation checkpointing.
    pub fn checkpoint_every(&self) -> Option<usize> {
        self.activation_checkpointing
            .then_some(self.checkpoint_every)
    }

    /// Where the activations live: checkpointing, and the kept inputs offloaded or not,
    /// partitioned over the tensor-parallel group or not (no
    /// backend scratch: see [`ActivationPlacement::with_scratch_of`](crate::bridge::ActivationPlacement::with_scratch_of)).
    pub fn activation_placement(&self) -> crate::bridge::ActivationPlacement {
        crate::bridge::ActivationPlacement {
            checkpoint_every: self.checkpoint_every(),
            offload: self.offload_activations,
            backend_scratch: 0,
            partitions: match self.partition_activations {
                true => self.tensor_parallel_size,
                false => 1,
            },
        }
    }

    /// The engine's knobs as this run's flags set them, with the model's `activation_bytes`
    /// in the arena and its `kept_inputs` (both from [`crate::bridge`]): the one mapping of the flags to the engine, whose
    /// [`plan_shape`](EngineConfig::plan_shape) is the plan's.
    pub fn engine_config(&self, activation_bytes: u64, kept_inputs: KeptInputs) -> EngineConfig {
        EngineConfig {
            stage: self.zero_stage,
            precision: self.precision.into(),
            reduce_bucket_bytes: usize::try_from(self.reduce_bucket_size.0).unwrap_or(usize::MAX),
            persistence_threshold: self.param_persistence_threshold,
            prefetch_units: self.prefetch_units,
            grad_clip: self.grad_clip,
            adam: AdamW {
                weight_decay: self.weight_decay,
                ..AdamW::default()
            },
            memory_limit: self.memory_limit.map(|m| m.0),
            defragment: !self.no_defragment,
            activation_bytes,
            offload_optimizer: self.offload_optimizer.is_on(),
            optimizer_file: self.offload_optimizer == OffloadTier::Nvme,
            offload_params: self.offload_params.is_on(),
            params_file: self.offload_params == OffloadTier::Nvme,
            delayed_param_update: self.delayed_param_update,
            offload_gradients: self.offload_gradients,
            nvme_prefetch_bytes: usize::try_from(self.nvme_prefetch_bytes.0).unwrap_or(usize::MAX),
            host_memory_limit: self.host_memory_limit.map(|m| m.0),
            kept_inputs,
            ..EngineConfig::default()
        }
    }

    /// Micro-steps per optimizer step on each rank (after [`validate`](Self::validate), the
    /// global batch is a whole multiple of `micro_batch_size * data_parallel_size()`).
    pub fn grad_accum_steps(&self) -> usize {
        self.batch_size / self.one_micro_batch_per_rank().max(1)
    }

    /// Sequences in a global batch of one micro-batch per data-parallel rank (the ranks of a
    /// tensor-parallel group share theirs): the global batch a run takes when none is given
    /// (with the local backend; see `TrainArgs::merge`) and `zero-train plan` takes, since
    /// the global batch changes no rank's memory.
    pub fn one_micro_batch_per_rank(&self) -> usize {
        self.micro_batch_size
            .saturating_mul(self.data_parallel_size())
    }

    /// What the run offloads and where, in words ("optimizer offloaded to files,
    /// parameters offloaded to the host"; empty when nothing is).
    #[must_use]
    pub fn offloads(&self) -> String {
        let tiers = [
            ("optimizer", self.offload_optimizer),
            ("parameters", self.offload_params),
        ];
        let mut words: Vec<String> = tiers
            .iter()
            .filter_map(|(what, tier)| tier.place().map(|at| format!("{what} offloaded to {at}")))
            .collect();
        if self.offload_gradients && self.offload_optimizer.is_on() {
            words.insert(1, "gradients offloaded to the host".into());
        }
        words.join(", ")
    }

    /// The data-parallel ranks, `world_size / tensor_parallel_size` (the world size itself
    /// at T = 1; at least 1, and exact once [`validate_world`](Self::validate_world) passed).
    pub fn data_parallel_size(&self) -> usize {
        (self.world_size / self.tensor_parallel_size.max(1)).max(1)
    }

    /// The model shape this configuration asks for: the shape of the `--init-from` file when
    /// one is given (shape flags must then agree with it), else the preset with explicit
    /// overrides. Called by [`validate`](Self::validate) alone, which hands the shape on.
    ///
    /// # Errors
    /// An unknown preset, an invalid shape, an unreadable `--init-from` file or a shape flag
    /// that contradicts it.
    pub(crate) fn model_config(&self) -> Result<GptConfig, ConfigError> {
        if let Some(path) = &self.init_from {
            return crate::checkpoint::init::file_model(path, self);
        }
        let preset = GptConfig::preset(&self.model)?;
        let (vocab, layers, heads, dim) = (
            self.vocab.unwrap_or(preset.vocab_size),
            self.layers.unwrap_or(preset.num_layers),
            self.heads.unwrap_or(preset.num_heads),
            self.dim.unwrap_or(preset.channels),
        );
        let context = preset.max_seq_len.max(self.seq_len);
        GptConfig::new(context, vocab, layers, heads, dim).map_err(|source| ConfigError::Shape {
            shape: format!(
                "--model {} gives --layers {layers} --heads {heads} --dim {dim} --vocab {vocab}",
                self.model
            ),
            source,
        })
    }
}
