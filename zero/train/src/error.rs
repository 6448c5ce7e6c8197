//! Everything that can stop a training run, each with what the user needs to fix it.
//!
//! One error type per concern: [`ConfigError`] (flags and the config file),
//! [`DataError`](crate::data::DataError) (token files; [`TokenFileError`](crate::data::TokenFileError)
//! for their bytes), [`CheckpointError`](crate::checkpoint::CheckpointError) (model files and
//! training states; [`LlmcFormatError`](crate::checkpoint::LlmcFormatError) and
//! [`SafetensorsError`](crate::checkpoint::SafetensorsError) for the bytes of each format) and
//! [`TrainError`], a run's, which wraps them. Each carries [`IoError`] for its I/O failures,
//! made by one helper (`fsio::failed`).

use std::path::PathBuf;

/// The one I/O error of this crate's error enums: zero-state's, so that model files, token
/// files and training states report a failed open, read or write alike, naming the path.
pub use zero_state::IoError;

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file could not be read.
    #[error(transparent)]
    Read(#[from] IoError),
    /// The config file is not valid TOML for these keys.
    #[error("config file {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message, with the line.
        message: String,
    },
    /// A value is out of its range or inconsistent with another.
    #[error("invalid --{flag} {value} (or `{key}` in --config): {expected}", flag = key.replace('_', "-"))]
    OutOfRange {
        /// The field, spelled as its config key (its flag has dashes).
        key: &'static str,
        /// The value given.
        value: String,
        /// What would be right.
        expected: String,
    },
    /// The model shape the configuration asks for is invalid.
    #[error(transparent)]
    Model(#[from] zero_gpt::GptError),
    /// The preset with its overrides is not a valid model.
    #[error("{shape}: {source}")]
    Shape {
        /// The shape the flags asked for, as flags.
        shape: String,
        /// Why the model refused it.
        #[source]
        source: zero_gpt::GptError,
    },
    /// The `--init-from` file cannot be read.
    #[error("--init-from: {0}")]
    InitFrom(Box<crate::checkpoint::CheckpointError>),
    /// A shape flag contradicts the shape the `--init-from` file brings.
    #[error(
        "--{flag} {given} contradicts {path}, whose model has {field} = {found}: the file brings \
         its own shape, so leave --{flag} out"
    )]
    ShapeConflict {
        /// The flag.
        flag: &'static str,
        /// The field as the model names it.
        field: &'static str,
        /// The flag's value.
        given: usize,
        /// The file's value.
        found: usize,
        /// The file.
        path: PathBuf,
    },
    /// `--model` names a preset whose shape is not the `--init-from` file's.
    #[error(
        "--model {preset} contradicts {path}, whose model is {found}: the file brings its own \
         shape, so leave --model out"
    )]
    PresetConflict {
        /// The preset named.
        preset: String,
        /// The file's shape, as flags spell it.
        found: String,
        /// The file.
        path: PathBuf,
    },
    /// The merged layers do not form a configuration.
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

/// Why `zero-train` stopped.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The model configuration is invalid.
    #[error(transparent)]
    Model(#[from] zero_gpt::GptError),
    /// Token files are missing or corrupt.
    #[error(transparent)]
    Data(#[from] crate::data::DataError),
    /// A checkpoint could not be written or read.
    #[error(transparent)]
    Checkpoint(#[from] crate::checkpoint::CheckpointError),
    /// The ZeRO engine failed (memory, communication, unit order), or its optimizer or
    /// schedule refused its settings.
    #[error(transparent)]
    Engine(#[from] zero::Error),
    /// A collective outside the engine failed.
    #[error(transparent)]
    Comm(#[from] zero_comm::CommError),
    /// The data directory lacks the token files.
    #[error(
        "no token file at {path}: run `bash scripts/train.sh` (which fetches and prepares the \
         Shakespeare corpus) or `zero-train prepare --text FILE... --out DIR`"
    )]
    NoData {
        /// The missing file.
        path: PathBuf,
    },
    /// An export that cannot be made as asked.
    #[error("export: {0}")]
    Export(String),
    /// A saved state does not match this run.
    #[error("cannot resume from {dir}: {reason}")]
    Resume {
        /// The state directory.
        dir: PathBuf,
        /// What does not match.
        reason: String,
    },
    /// With no `--memory-limit`, the ranks that share one memory (host RAM, or a GPU) need
    /// more of it than there is.
    #[error(
        "this run needs {} per rank ({per_rank} bytes: model states, transient unit buffers \
         and activations) x {ranks} rank(s) sharing {memory}, which is {}; {hint}. \
         --memory-limit SIZE sets each rank's arena explicitly (a cap above it is taken as \
         asked)",
        zero_alloc::human_bytes(*per_rank),
        zero_alloc::human_bytes(*available)
    )]
    MachineMemory {
        /// Bytes one rank's arena needs.
        per_rank: u64,
        /// Ranks drawing on the memory.
        ranks: usize,
        /// Which memory: the host's available memory, or a GPU's.
        memory: &'static str,
        /// Its bytes.
        available: u64,
        /// A stage and options that fit, or what the leanest needs.
        hint: String,
    },
    /// With `--offload-optimizer` on a GPU, the ranks on this host need more host memory for
    /// their offloaded optimizer states than the host has available.
    #[error(
        "--offload-optimizer needs {} of host memory per rank ({per_rank} bytes: optimizer \
         states and one piece's staging, page-locked) x {ranks} rank(s) on this host, but it \
         has {} available ({read}): put fewer ranks on this host, or drop \
         --offload-optimizer",
        zero_alloc::human_bytes(*per_rank),
        zero_alloc::human_bytes(*available)
    )]
    OffloadHostMemory {
        /// Host bytes one rank's offloaded optimizer needs.
        per_rank: u64,
        /// Ranks on this host.
        ranks: usize,
        /// The host's available memory.
        available: u64,
        /// Where that figure was read (`MemAvailable`, or `ZERO_HOST_MEMORY` where set).
        read: &'static str,
    },
    /// A file (the metrics log) could not be created or written.
    #[error(transparent)]
    Io(#[from] IoError),
    /// A backend this build or this runner does not offer.
    #[error("{0}")]
    Unsupported(String),
    /// The operating system refused a rank's thread.
    #[error("cannot start the thread of rank {rank}: {source}")]
    Spawn {
        /// The rank.
        rank: usize,
        /// What the OS said.
        source: std::io::Error,
    },
    /// A rank's thread panicked (a bug); its peers were stopped.
    #[error("rank {rank} panicked: {message}")]
    RankPanicked {
        /// The rank.
        rank: usize,
        /// The panic message.
        message: String,
    },
    /// The cross-rank fingerprint (`--fingerprint-every`) found ranks whose parameters differ
    /// from the majority's.
    #[error(
        "parameter fingerprint after step {step} (checked on rank {rank}): ranks {ranks:?} hold \
         parameters unlike the other ranks' (hashes by rank: {hashes})"
    )]
    Diverged {
        /// The steps completed.
        step: u64,
        /// The rank reporting.
        rank: usize,
        /// The ranks that differ (every rank when no hash has a majority).
        ranks: Vec<usize>,
        /// Every rank's hash, in hex.
        hashes: String,
    },
}

/// A state's engine and collective failures are the run's, and a state that does not fit
/// the run refuses the resume; the rest are checkpoint errors.
impl From<zero_state::StateError> for TrainError {
    fn from(e: zero_state::StateError) -> Self {
        use zero_state::StateError;
        match e {
            StateError::Engine(e) => Self::Engine(e),
            StateError::Comm(e) => Self::Comm(e),
            StateError::Mismatch { dir, reason } => Self::Resume { dir, reason },
            other => Self::Checkpoint(other.into()),
        }
    }
}

impl From<super::bridge::StepError> for TrainError {
    fn from(e: super::bridge::StepError) -> Self {
        match e {
            super::bridge::StepError::Engine(e) => Self::Engine(e),
            super::bridge::StepError::Model(e) => Self::Model(e),
            e @ super::bridge::StepError::NoLoss => Self::Unsupported(e.to_string()),
        }
    }
}
