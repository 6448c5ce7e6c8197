//! `zero-train`: trains the bundled GPT-2 with ZeRO stages 0-3, its ranks as threads of one
//! process (`--backend local`) or as processes under mpirun (`--backend mpi`).
//!
//! ```text
//! zero-train [FLAGS]                          train (flags over --config FILE over defaults)
//! zero-train prepare --text FILE... --out DIR tokenise text into train.bin / val.bin
//! zero-train export --from SRC --to FILE      a model file (safetensors or llm.c) out of a
//!                                             training state or another model file
//! zero-train plan [FLAGS]                     each rank's memory at every stage, untrained
//! zero-train launch --nproc-per-node N [--max-restarts K] [--min-nproc M] -- FLAGS
//!                                             N rank processes, restarted from --save on failure
//! ```

use clap::{Parser, Subcommand};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use zero_train::{train, TrainArgs};

#[derive(Parser)]
#[command(
    name = "zero-train",
    version,
    about = "Train GPT-2 with ZeRO stages 0-3"
)]
#[command(args_conflicts_with_subcommands = true)]
// A flag given twice takes its last value, as argparse, torchrun and GNU tools do, so a
// wrapper's defaults (scripts/train.sh) can be overridden on its command line.
#[command(args_override_self = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    train: TrainArgs,
}

#[derive(Subcommand)]
enum Command {
    /// Tokenise text files with the GPT-2 BPE into llm.c token files.
    Prepare {
        /// Text files, one document each, in order.
        #[arg(long, num_args = 1.., required = true)]
        text: Vec<PathBuf>,
        /// Directory to write train.bin and val.bin into.
        #[arg(long)]
        out: PathBuf,
        /// Fraction of tokens held out for validation (taken from the start).
        #[arg(long, default_value_t = 0.1)]
        val_fraction: f64,
    },
    /// Write a model (Hugging Face safetensors + config.json, one file or sharded, or llm.c
    /// model.bin) from a training state, an llm.c model.bin or a safetensors file or folder.
    Export(zero_train::checkpoint::export::ExportArgs),
    /// Print each rank's memory for these training flags at every ZeRO stage (model states,
    /// activations, transient buffers, the offloaded optimizer's host arena) beside the
    /// paper's formula, without training. It takes every training flag, so a run's command
    /// line can be planned as is; those that change no rank's memory (--steps, --lr, --save,
    /// ...) are checked and otherwise ignored.
    #[command(args_override_self = true)]
    Plan(Box<PlanArgs>),
    /// Start --nproc-per-node rank processes (TCP backend, torchrun's variables; or one
    /// mpirun for --backend mpi) and restart them all from the newest complete state of
    /// --save when one fails, up to --max-restarts times (docs/faults.md).
    #[command(args_override_self = true)]
    Launch(zero_train::run::elastic::LaunchArgs),
}

#[derive(clap::Args)]
struct PlanArgs {
    /// Also price each stage's traffic per step on a link of this rate each way (tc's
    /// units, as `scripts/cluster.sh up` takes them: 1gbit, 250mbit, 100mbps).
    #[arg(long, value_name = "RATE")]
    link_rate: Option<zero_train::plan::link_rate::LinkRate>,
    #[command(flatten)]
    train: TrainArgs,
}

fn main() -> ExitCode {
    // Warnings (a pinned-memory fallback, a skipped fp16 step) reach stderr; RUST_LOG=debug
    // and friends say more.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Some(Command::Prepare {
            text,
            out,
            val_fraction,
        }) => prepare(&text, &out, val_fraction),
        Some(Command::Export(args)) => export(&args),
        Some(Command::Launch(args)) => zero_train::run::elastic::launch(&args),
        Some(Command::Plan(args)) => plan_config(&args.train)
            .map_err(|e| e.to_string())
            .and_then(|cfg| {
                zero_train::plan::plan_report::plan_table(&cfg, args.link_rate)
                    .map_err(|e| e.to_string())
            })
            .map(|table| print!("{table}")),
        None => cli
            .train
            .resolve()
            .map_err(|e| e.to_string())
            .and_then(|(cfg, model)| {
                eprintln!("zero-train: {}", start_up_line(&cfg, &model));
                train(&cfg).map(|_| ()).map_err(|e| e.to_string())
            }),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("zero-train: error: {message}");
            ExitCode::FAILURE
        }
    }
}

/// What `zero-train plan` plans: the training flags, with one micro-batch per rank as the
/// global batch unless `--batch-size` was set (then it must divide into the ranks, as in
/// training; the local backend derives it that way too).
fn plan_config(
    args: &TrainArgs,
) -> Result<zero_train::cli::config::TrainConfig, zero_train::error::ConfigError> {
    if args.explicit_keys()?.iter().any(|k| k == "batch_size") {
        args.resolve().map(|(cfg, _)| cfg)
    } else {
        let mut cfg = args.merge()?;
        cfg.batch_size = cfg.one_micro_batch_per_rank();
        Ok(cfg)
    }
}

/// `zero-train prepare`: text files to llm.c token files.
fn prepare(text: &[PathBuf], out: &Path, val_fraction: f64) -> Result<(), String> {
    let s = zero_train::data::prepare(text, out, val_fraction).map_err(|e| e.to_string())?;
    eprintln!(
        "prepared {} documents ({} bytes): {} train tokens in {}, {} val tokens in {}",
        s.documents,
        s.text_bytes,
        s.train_tokens,
        s.train_path.display(),
        s.val_tokens,
        s.val_path.display()
    );
    Ok(())
}

/// `zero-train export`: a model file from a training state or another model file.
fn export(args: &zero_train::checkpoint::export::ExportArgs) -> Result<(), String> {
    let model = zero_train::checkpoint::export::export(args).map_err(|e| e.to_string())?;
    eprintln!(
        "exported {} layers, {} channels, {} heads, vocab {} to {}",
        model.num_layers,
        model.channels,
        model.num_heads,
        model.vocab_size,
        args.to.display()
    );
    Ok(())
}

/// What a training run says before it starts: the model, stage, ranks, batch and steps.
fn start_up_line(cfg: &zero_train::cli::config::TrainConfig, m: &zero_gpt::GptConfig) -> String {
    // Other backends take the world size from their launcher, known once joined.
    let ranks = match cfg.backend {
        zero_train::cli::config::Backend::Local if cfg.world_size == 1 => "1 rank".into(),
        zero_train::cli::config::Backend::Local => format!("{} ranks", cfg.world_size),
        _ => "ranks from the launcher".to_string(),
    };
    let ranks = match cfg.tensor_parallel_size {
        1 => ranks,
        t => format!("{ranks} in tensor-parallel groups of {t}"),
    };
    // The shape the run builds: the preset's, flags applied, or the --init-from file's.
    let name = match &cfg.init_from {
        Some(path) => format!("from {}", path.display()),
        None => cfg.model.clone(),
    };
    let shape = format!(
        " (L {}, C {}, NH {}, V {})",
        m.num_layers, m.channels, m.num_heads, m.vocab_size
    );
    let offload = match cfg.offloads() {
        words if words.is_empty() => String::new(),
        words => format!(" ({words})"),
    };
    let steps = match cfg.steps {
        1 => "1 step".to_string(),
        n => format!("{n} steps"),
    };
    format!(
        "model {name}{shape} | ZeRO stage {}{offload} | {ranks} | global batch {} x {} tokens | \
         {steps}",
        cfg.zero_stage as u8, cfg.batch_size, cfg.seq_len
    )
}
