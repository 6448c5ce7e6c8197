//! One training run: ranks as threads of this process on the local backend, each driving
//! the GPT through its ZeRO engine over its own part of every global batch.

use super::bridge::{eval_loss, gpt_units, micro_step, with_logits};
use super::config::{Backend, TrainConfig};
use super::error::TrainError;
use super::metrics::{memory_table, step_json, MetricsFile, RankReport, StepMetrics};
use super::resume::{load_llmc, load_state, save_llmc, save_state, step_dir};
use crate::data::{DataLoader, LoaderConfig, TokenFile, TRAIN_FILE, VAL_FILE};
use serde_json::json;
use std::io::IsTerminal;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use zero::optim::{AdamW, CosineSchedule};
use zero::{expected_model_state_bytes, Engine, EngineConfig, Traffic, ZeroStage};
use zero_comm::{Communicator, ReduceOp};
use zero_gpt::{init_unit, sample_top_k, Gpt, GptConfig, Rng};

/// GPT-2's end-of-text token, the prompt of the closing sample.
const END_OF_TEXT: u32 = 50256;

/// What a finished run hands back.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSummary {
    /// Parameters of the model.
    pub num_params: usize,
    /// Mean global-batch loss of every step run.
    pub losses: Vec<f32>,
    /// Validation losses as (step, loss).
    pub val_losses: Vec<(u64, f32)>,
    /// The closing sample's tokens.
    pub sample: Vec<u32>,
    /// Per-rank memory and traffic.
    pub ranks: Vec<RankReport>,
}

/// The model shape a configuration asks for: the preset, with explicit overrides.
///
/// # Errors
/// An unknown preset or an invalid shape.
pub fn model_config(cfg: &TrainConfig) -> Result<GptConfig, TrainError> {
    let preset = GptConfig::preset(&cfg.model)?;
    let config = GptConfig::new(
        preset.max_seq_len.max(cfg.seq_len),
        cfg.vocab.unwrap_or(preset.vocab_size),
        cfg.layers.unwrap_or(preset.num_layers),
        cfg.heads.unwrap_or(preset.num_heads),
        cfg.dim.unwrap_or(preset.channels),
    )?;
    Ok(config)
}

/// Everything the ranks share, read-only except the metrics file and progress display.
struct Shared<'a> {
    cfg: &'a TrainConfig,
    model: GptConfig,
    train: Arc<TokenFile>,
    val: Arc<TokenFile>,
    metrics: Mutex<Option<MetricsFile>>,
    progress: Progress,
}

/// Runs a training job as `cfg` describes and returns its summary.
///
/// # Errors
/// Any [`TrainError`]; a rank's failure stops every rank.
pub fn train(cfg: &TrainConfig) -> Result<RunSummary, TrainError> {
    let mut cfg = cfg.clone();
    let group = RankGroup::new(&mut cfg)?;
    run_group(&cfg, group)
}

/// This process's ranks: all of them as threads (local), or the one MPI gave it.
struct RankGroup {
    comms: Vec<Communicator>,
    /// Keeps MPI initialised until the communicators are gone.
    #[cfg(feature = "mpi")]
    _mpi: Option<zero_comm::mpi::Mpi>,
}

impl RankGroup {
    /// Creates the communicators; under MPI the world size comes from `mpirun` and replaces
    /// `cfg.world_size`.
    fn new(cfg: &mut TrainConfig) -> Result<Self, TrainError> {
        match cfg.backend {
            Backend::Local => Ok(Self {
                comms: zero_comm::local::create(cfg.world_size)?,
                #[cfg(feature = "mpi")]
                _mpi: None,
            }),
            #[cfg(feature = "mpi")]
            Backend::Mpi => {
                let mpi = zero_comm::mpi::Mpi::init()?;
                cfg.world_size = mpi.size();
                let comm = mpi.world(zero_comm::Config::default())?;
                Ok(Self {
                    comms: vec![comm],
                    _mpi: Some(mpi),
                })
            }
            #[cfg(not(feature = "mpi"))]
            Backend::Mpi => Err(TrainError::Unsupported(
                "--backend mpi needs a build with `--features mpi` (and mpirun to launch it)"
                    .into(),
            )),
            Backend::Nccl => Err(TrainError::Unsupported(
                "--backend nccl is not wired into zero-train yet (no CUDA kernels for the model)"
                    .into(),
            )),
        }
    }

    /// True when this process hosts rank 0 (which reports).
    fn hosts_rank_zero(&self) -> bool {
        self.comms.first().is_some_and(|c| c.rank() == 0)
    }
}

fn run_group(cfg: &TrainConfig, group: RankGroup) -> Result<RunSummary, TrainError> {
    cfg.validate()?;
    if cfg.device != "cpu" {
        return Err(TrainError::Unsupported(format!(
            "device {:?}: only cpu kernels exist so far",
            cfg.device
        )));
    }
    let model = model_config(cfg)?;
    let open = |name: &str| -> Result<Arc<TokenFile>, TrainError> {
        let path = cfg.data.join(name);
        if !path.exists() {
            return Err(TrainError::NoData { path });
        }
        Ok(Arc::new(TokenFile::open_with_vocab(
            &path,
            model.vocab_size as u32,
        )?))
    };
    let reports = group.hosts_rank_zero();
    let metrics = match &cfg.metrics {
        Some(path) if reports => Some(MetricsFile::create(path)?),
        _ => None,
    };
    let shared = Shared {
        cfg,
        model,
        train: open(TRAIN_FILE)?,
        val: open(VAL_FILE)?,
        metrics: Mutex::new(metrics),
        progress: Progress::new(cfg.steps, reports),
    };
    let results: Vec<Result<RankOutput, TrainError>> = std::thread::scope(|s| {
        let handles: Vec<_> = group
            .comms
            .into_iter()
            .map(|comm| {
                let shared = &shared;
                (comm.rank(), s.spawn(move || rank_main(shared, comm)))
            })
            .collect();
        handles
            .into_iter()
            .map(|(rank, h)| {
                h.join().unwrap_or_else(|panic| {
                    let message = panic
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default();
                    Err(TrainError::RankPanicked { rank, message })
                })
            })
            .collect()
    });
    shared.progress.finish();
    // The first rank's own error is the cause; the others usually report the broken group.
    let mut outputs = Vec::with_capacity(results.len());
    let mut first_err = None;
    for r in results {
        match r {
            Ok(o) => outputs.push(o),
            Err(e) => {
                if first_err.is_none() || matches!(first_err, Some(TrainError::Comm(_))) {
                    first_err = Some(e);
                }
            }
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    let ranks: Vec<RankReport> = outputs.iter().map(|o| o.report).collect();
    let first = outputs.swap_remove(0);
    let summary = RunSummary {
        num_params: first.num_params,
        losses: first.losses,
        val_losses: first.val_losses,
        sample: first.sample,
        ranks,
    };
    if let Some(m) = shared
        .metrics
        .lock()
        .ok()
        .as_deref_mut()
        .and_then(Option::as_mut)
    {
        m.write(&json!({
            "summary": true,
            "num_params": summary.num_params,
            "world_size": cfg.world_size,
            "precision": cfg.precision,
            "zero_stage": cfg.zero_stage,
            "steps": summary.losses.len(),
            "final_loss": summary.losses.last(),
            "ranks": summary.ranks.iter().map(RankReport::to_json).collect::<Vec<_>>(),
        }))?;
    }
    if reports {
        eprint!("{}", memory_table(&summary.ranks));
    }
    Ok(summary)
}

/// What one rank returns.
struct RankOutput {
    num_params: usize,
    losses: Vec<f32>,
    val_losses: Vec<(u64, f32)>,
    sample: Vec<u32>,
    report: RankReport,
}

fn rank_main(shared: &Shared<'_>, comm: Communicator) -> Result<RankOutput, TrainError> {
    let cfg = shared.cfg;
    let gcfg = shared.model;
    let model = Gpt::new(gcfg)?;
    let layout = model.layout().clone();
    let rank = comm.rank();
    let world = comm.size();
    let accum = cfg.grad_accum_steps();
    let (b, t) = (cfg.micro_batch_size, cfg.seq_len);
    let stage = cfg.stage();
    let engine_config = EngineConfig {
        stage,
        precision: cfg.precision.into(),
        reduce_bucket_bytes: usize::try_from(cfg.reduce_bucket_size.0).unwrap_or(usize::MAX),
        persistence_threshold: cfg.param_persistence_threshold,
        prefetch_units: cfg.prefetch_units,
        grad_clip: cfg.grad_clip,
        adam: AdamW {
            weight_decay: cfg.weight_decay,
            ..AdamW::default()
        },
        memory_limit: cfg.memory_limit.map(|m| m.0),
    };
    engine_config.adam.validate()?;
    let mut init_err = None;
    let mut engine = Engine::new(comm, gpt_units(&layout), engine_config, |unit, w| {
        if let Err(e) = init_unit(&gcfg, &layout, unit, cfg.seed, w) {
            init_err.get_or_insert(e);
        }
    })?;
    if let Some(e) = init_err {
        return Err(e.into());
    }
    let loader_config = LoaderConfig {
        micro_batch: b,
        seq_len: t,
        rank,
        world_size: world,
        grad_accum_steps: accum,
        seed: cfg.seed,
        shuffle: false,
    };
    let mut loader = DataLoader::new(shared.train.clone(), loader_config)?;
    let mut start = 0;
    if let Some(path) = &cfg.init_from {
        load_llmc(path, &gcfg, &mut engine)?;
    }
    if let Some(dir) = &cfg.resume {
        start = load_state(dir, &gcfg, &mut engine, &mut loader)?;
    }
    let schedule = CosineSchedule {
        max_lr: cfg.lr,
        warmup_steps: cfg.warmup_steps.min(cfg.steps),
        total_steps: cfg.steps,
        min_lr_frac: cfg.min_lr_ratio,
    };
    schedule.validate()?;
    let mut acts = model.activations(b, t)?;
    let (mut x, mut y) = (vec![0u32; b * t], vec![0u32; b * t]);
    let global_tokens = (cfg.batch_size * t) as f64;
    let mut out = RankOutput {
        num_params: layout.num_params(),
        losses: Vec::new(),
        val_losses: Vec::new(),
        sample: Vec::new(),
        report: RankReport {
            rank,
            measured: engine.measured_model_state_bytes()?,
            expected: engine.expected_model_state_bytes(),
            stage0: expected_model_state_bytes(
                layout.num_params() as u64,
                world,
                ZeroStage::Zero0,
                cfg.precision.into(),
            ),
            peak_bytes: 0,
            traffic_per_step: Traffic::default(),
            comm_bytes_sent_per_step: 0.0,
        },
    };
    if cfg.eval_every > 0 {
        // The starting point of the validation curve (llm.c evaluates at step 0 too).
        let val = evaluate(shared, &mut engine, &model, &loader_config)?;
        out.val_losses.push((start, val));
        if rank == 0 {
            shared
                .progress
                .line(&format!("step {start} | val loss {val:.4}"));
            write_metrics(shared, &json!({"step": start, "val_loss": val}))?;
        }
    }
    let mut traffic = Traffic::default();
    let mut sent = 0u64;
    for step in start..cfg.steps {
        let began = Instant::now();
        let (traffic_before, sent_before) = (engine.traffic(), engine.comm().stats().bytes_sent);
        let lr = schedule.lr(step);
        let mut local = 0.0f32;
        for _ in 0..accum {
            loader.next_micro_batch(&mut x, &mut y)?;
            local += micro_step(&mut engine, &model, &mut acts, &x, &y)?;
        }
        let mut loss = [local / accum as f32];
        engine
            .comm()
            .all_reduce_in_place(&mut loss, ReduceOp::Avg)?;
        let report = engine.step(lr)?;
        let after = engine.traffic();
        traffic.all_reduce += after.all_reduce - traffic_before.all_reduce;
        traffic.reduce_scatter += after.reduce_scatter - traffic_before.reduce_scatter;
        traffic.all_gather += after.all_gather - traffic_before.all_gather;
        sent += engine.comm().stats().bytes_sent - sent_before;
        let secs = began.elapsed().as_secs_f64();
        out.losses.push(loss[0]);
        let m = StepMetrics {
            step: step + 1,
            loss: loss[0],
            lr,
            grad_norm: report.grad_norm,
            tokens_per_s: global_tokens / secs,
            step_ms: secs * 1e3,
            loss_scale: report.loss_scale,
            skipped: report.skipped,
        };
        if rank == 0 {
            shared.progress.step(&m);
            write_metrics(shared, &step_json(&m))?;
        }
        let last = step + 1 == cfg.steps;
        if cfg.eval_every > 0 && ((step + 1) % cfg.eval_every == 0 || last) {
            let val = evaluate(shared, &mut engine, &model, &loader_config)?;
            out.val_losses.push((step + 1, val));
            if rank == 0 {
                shared
                    .progress
                    .line(&format!("step {} | val loss {val:.4}", step + 1));
                write_metrics(shared, &json!({"step": step + 1, "val_loss": val}))?;
            }
        }
        if let Some(dir) = &cfg.save {
            if last || (cfg.save_every > 0 && (step + 1) % cfg.save_every == 0) {
                let states = engine.export_states()?;
                if rank == 0 {
                    let at = step_dir(dir, step + 1);
                    save_state(
                        &at,
                        cfg,
                        &gcfg,
                        &states,
                        engine.steps(),
                        &loader.state(),
                        step + 1,
                    )?;
                    shared.progress.line(&format!("saved {}", at.display()));
                }
                // Nobody reads a half-written state: ranks wait for rank 0's write.
                engine.comm().barrier()?;
            }
        }
    }
    if let Some(path) = &cfg.export_llmc {
        let states = engine.export_states()?;
        if rank == 0 {
            save_llmc(path, &gcfg, &states)?;
        }
        engine.comm().barrier()?;
    }
    if cfg.sample_tokens > 0 {
        out.sample = sample(cfg, &mut engine, &model, t)?;
        if rank == 0 {
            let text = decode(&out.sample);
            shared.progress.line(&format!("sample:\n{text}"));
        }
    }
    let steps_run = (cfg.steps - start).max(1);
    out.report.peak_bytes = engine.arena().stats().peak_allocated as u64;
    out.report.traffic_per_step = Traffic {
        all_reduce: traffic.all_reduce / steps_run,
        reduce_scatter: traffic.reduce_scatter / steps_run,
        all_gather: traffic.all_gather / steps_run,
    };
    out.report.comm_bytes_sent_per_step = sent as f64 / steps_run as f64;
    Ok(out)
}

fn write_metrics(shared: &Shared<'_>, value: &serde_json::Value) -> Result<(), TrainError> {
    if let Ok(mut guard) = shared.metrics.lock() {
        if let Some(m) = guard.as_mut() {
            m.write(value)?;
        }
    }
    Ok(())
}

/// Mean validation loss over `eval_batches` global batches from the start of val.bin.
fn evaluate(
    shared: &Shared<'_>,
    engine: &mut Engine,
    model: &Gpt,
    train_config: &LoaderConfig,
) -> Result<f32, TrainError> {
    let cfg = LoaderConfig {
        grad_accum_steps: 1,
        ..*train_config
    };
    let mut loader = DataLoader::new(shared.val.clone(), cfg)?;
    let mut acts = model.activations(cfg.micro_batch, cfg.seq_len)?;
    let n = cfg.micro_batch * cfg.seq_len;
    let (mut x, mut y) = (vec![0u32; n], vec![0u32; n]);
    let mut sum = 0.0f32;
    let batches = shared.cfg.eval_batches.max(1);
    for _ in 0..batches {
        loader.next_micro_batch(&mut x, &mut y)?;
        sum += eval_loss(engine, model, &mut acts, &x, &y)?;
    }
    let mut mean = [sum / batches as f32];
    engine
        .comm()
        .all_reduce_in_place(&mut mean, ReduceOp::Avg)?;
    Ok(mean[0])
}

/// Generates `sample_tokens` tokens after `<|endoftext|>` with seeded top-k sampling. Every
/// rank computes the same tokens (same parameters, same seed), so stage 3's gathers stay in
/// step without a broadcast.
fn sample(
    cfg: &TrainConfig,
    engine: &mut Engine,
    model: &Gpt,
    t: usize,
) -> Result<Vec<u32>, TrainError> {
    let config = model.config();
    let start = if (END_OF_TEXT as usize) < config.vocab_size {
        END_OF_TEXT
    } else {
        0
    };
    let mut rng = Rng::new(cfg.seed ^ 0x5eed);
    let mut acts = model.activations(1, t)?;
    let mut tokens = vec![start];
    let vp = config.padded_vocab_size;
    for _ in 0..cfg.sample_tokens {
        // The context is the last t tokens, padded on the right: causal attention keeps the
        // padding from touching the positions that are read.
        let ctx_start = tokens.len().saturating_sub(t);
        let ctx = &tokens[ctx_start..];
        let pos = ctx.len() - 1;
        let mut window = vec![0u32; t];
        window[..ctx.len()].copy_from_slice(ctx);
        let next = with_logits(engine, model, &mut acts, &window, |logits| {
            sample_top_k(
                &logits[pos * vp..(pos + 1) * vp],
                config.vocab_size,
                cfg.top_k,
                1.0,
                &mut rng,
            )
        })?;
        match next {
            Some(tok) => tokens.push(tok),
            None => break,
        }
    }
    Ok(tokens[1..].to_vec())
}

/// GPT-2 text of `tokens` (lossy where a token is not valid UTF-8 on its own).
fn decode(tokens: &[u32]) -> String {
    match tiktoken_rs::r50k_base() {
        Ok(bpe) => bpe.decode(tokens).unwrap_or_else(|_| format!("{tokens:?}")),
        Err(_) => format!("{tokens:?}"),
    }
}

/// Rank 0's display: a progress bar on a terminal, plain lines otherwise.
struct Progress {
    bar: Option<indicatif::ProgressBar>,
}

impl Progress {
    fn new(steps: u64, shown: bool) -> Self {
        let bar = (shown && std::io::stderr().is_terminal()).then(|| {
            let bar = indicatif::ProgressBar::new(steps);
            if let Ok(style) = indicatif::ProgressStyle::with_template(
                "{bar:30} {pos}/{len} [{elapsed_precise}<{eta_precise}] {msg}",
            ) {
                bar.set_style(style);
            }
            bar
        });
        Self { bar }
    }

    fn step(&self, m: &StepMetrics) {
        let mut msg = format!(
            "loss {:.4} | lr {:.2e} | norm {:.3} | {:.0} tok/s | {:.0} ms",
            m.loss, m.lr, m.grad_norm, m.tokens_per_s, m.step_ms
        );
        if m.skipped {
            msg.push_str(&format!(
                " | fp16 overflow at loss scale {}: step skipped",
                m.loss_scale
            ));
        }
        match &self.bar {
            Some(bar) => {
                bar.set_position(m.step);
                bar.set_message(msg);
            }
            None => eprintln!("step {} | {msg}", m.step),
        }
    }

    fn line(&self, text: &str) {
        match &self.bar {
            Some(bar) => bar.println(text),
            None => eprintln!("{text}"),
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish();
        }
    }
}
