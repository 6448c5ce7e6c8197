//! One rank's training state and the four things a training loop does with it: [`step`],
//! [`evaluate`], [`save`] and [`report`] (plus the closing export and sample).
//!
//! [`step`]: Trainer::step
//! [`evaluate`]: Trainer::evaluate
//! [`save`]: Trainer::save
//! [`report`]: Trainer::report

mod engine_setup;
mod faults;
mod saving;

use crate::bridge::{arena_activations, eval_loss, Placement, TrainStep};
use crate::checkpoint::init::load_init;
use crate::checkpoint::resume::load_state;
use crate::data::{DataLoader, LoaderConfig};
use crate::error::TrainError;
use crate::run::metrics::{RankReport, StepMetrics};
use crate::run::sample::{decode, sample};
use crate::run::tp_traffic::TpCounter;
use crate::run::{RankOutput, Shared};
use engine_setup::build_engine;
use std::time::Instant;
use zero::optim::CosineSchedule;
use zero::{expected_model_state_bytes, Engine, EngineOps, Precision, Traffic, ZeroStage};
use zero_comm::{Communicator, ReduceOp};
use zero_gpt::{Activations, CpuBackend, Gpt, ParamLayout};
use zero_state::PendingSave;

/// One rank's model, engine, data and running totals, the model's kernels on backend `B`.
pub(crate) struct Trainer<'a, B: Placement = CpuBackend> {
    shared: &'a Shared<'a>,
    rank: usize,
    model: Gpt<B>,
    engine: Engine,
    loader: DataLoader,
    loader_config: LoaderConfig,
    schedule: CosineSchedule,
    /// Activations of one micro-batch, (B, T).
    acts: Activations<B>,
    /// The training micro-step the engine was declared, built once.
    train: TrainStep,
    /// Input and target tokens of one micro-batch, (B, T).
    x: Vec<u32>,
    y: Vec<u32>,
    /// The step the run starts from (0, or the resumed state's).
    start: u64,
    out: RankOutput,
    /// Collective traffic, and bytes sent and received, by the steps run so far.
    traffic: Traffic,
    sent: u64,
    received: u64,
    /// The tensor-parallel group's collectives by the steps run so far.
    tp_traffic: TpCounter,
    /// What the rank's files moved during the steps run so far.
    file_io: zero::FileIo,
    /// An `--async-save` whose pieces are being written, and when it started.
    pending_save: Option<(PendingSave, Instant)>,
    /// An injected `diverge` due at the next micro-step.
    diverge: bool,
    /// The `--trace` timeline, once its steps are recorded.
    trace: Option<zero::Trace>,
}

impl<B: Placement> std::fmt::Debug for Trainer<'_, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trainer")
            .field("rank", &self.rank)
            .field("start", &self.start)
            .finish_non_exhaustive()
    }
}

impl RankOutput {
    /// Nothing run yet; the model states the engine holds, beside the paper's formulas for
    /// its stage and for stage 0, and the activations: the model's buffers (`acts_bytes`)
    /// and the kept inputs the engine holds for it.
    fn new(
        engine: &Engine,
        acts_bytes: u64,
        num_params: usize,
        precision: Precision,
    ) -> Result<Self, TrainError> {
        let (kept_arena, kept_host) = engine.kept_input_bytes()?;
        Ok(Self {
            num_params,
            losses: Vec::new(),
            val_losses: Vec::new(),
            sample: Vec::new(),
            trace: None,
            report: RankReport {
                rank: engine.rank(),
                measured: engine.measured_model_state_bytes()?,
                expected: engine.expected_model_state_bytes(),
                stage0: expected_model_state_bytes(
                    num_params as u64,
                    engine.comm().size(),
                    ZeroStage::Zero0,
                    precision,
                ),
                peak_bytes: 0,
                activation_bytes: acts_bytes + kept_arena,
                activation_kept_bytes: kept_arena,
                activation_offloaded_bytes: kept_host,
                optimizer_offloaded_bytes: 0,
                grads_offloaded_bytes: engine.offloaded_grad_bytes()?,
                grads_arena_peak_bytes: 0,
                // Measured from the disk, not the engine's layout: 0 if it cannot be read.
                optimizer_file_bytes: engine
                    .optimizer_file_path()
                    .map_or(0, |p| std::fs::metadata(p).map_or(0, |m| m.len())),
                params_offloaded_bytes: 0,
                file_io_per_step: zero::FileIo::default(),
                params_file_bytes: engine
                    .params_file()
                    .map_or(0, |(p, _)| std::fs::metadata(p).map_or(0, |m| m.len())),
                traffic_per_step: Traffic::default(),
                comm_bytes_sent_per_step: 0.0,
                comm_bytes_received_per_step: 0.0,
                tensor_parallel: None,
            },
        })
    }
}

/// Loads the training state in `dir` (`--resume`) into `engine` and `loader` and returns
/// its step; rank 0 says so.
///
/// # Errors
/// Checkpoint errors; [`TrainError::Resume`] when the state is past `--steps`.
fn resume(
    shared: &Shared<'_>,
    dir: &std::path::Path,
    rank: usize,
    engine: &mut Engine,
    loader: &mut DataLoader,
) -> Result<u64, TrainError> {
    let cfg = shared.cfg;
    let began = Instant::now();
    let start = load_state(dir, &shared.model, engine, loader)?;
    if start > cfg.steps {
        return Err(TrainError::Resume {
            dir: dir.to_path_buf(),
            reason: format!("its state is at step {start}, past --steps {}", cfg.steps),
        });
    }
    if rank == 0 {
        let init = match &cfg.init_from {
            Some(path) => format!("; its weights, not {}'s", path.display()),
            None => String::new(),
        };
        shared.reporter.line(&format!(
            "resumed from {} at step {start} ({:.0} ms on rank 0{init})",
            dir.display(),
            began.elapsed().as_secs_f64() * 1e3
        ));
    }
    Ok(start)
}

impl<'a, B: Placement> Trainer<'a, B> {
    /// Builds this rank's engine on `ops` over its data-parallel group `comm` (beside its
    /// tensor-parallel group `tp`, when `model` is split over one) and its data loader for
    /// `model`, and loads `--init-from` and `--resume` when given. The data-parallel rank
    /// picks the batches, so the ranks of a tensor-parallel group read the same ones.
    ///
    /// # Errors
    /// Model, engine, data or checkpoint errors; [`TrainError::Resume`] when the resumed
    /// state is past `--steps`.
    pub(crate) fn new(
        shared: &'a Shared<'a>,
        comm: Communicator,
        tp: Option<Communicator>,
        model: Gpt<B>,
        ops: EngineOps,
    ) -> Result<Self, TrainError> {
        let cfg = shared.cfg;
        let (dp_rank, world) = (comm.rank(), comm.size());
        // The world rank: r = dp_index * T + tp_rank (zero::tensor_parallel::Grid).
        let rank = match &tp {
            Some(tp) => dp_rank * tp.size() + tp.rank(),
            None => dp_rank,
        };
        let mut engine = build_engine(shared, comm, &model, ops)?;
        if let Some(tp) = tp {
            engine = engine.with_tensor_parallel(tp);
        }
        let (b, t) = (cfg.micro_batch_size, cfg.seq_len);
        // First in the arena after the model states, so these pinned blocks leave no hole.
        let acts = arena_activations(&mut engine, &model, b, t, cfg.activation_placement())?;
        let loader_config = LoaderConfig {
            micro_batch: b,
            seq_len: t,
            rank: dp_rank,
            world_size: world,
            grad_accum_steps: cfg.grad_accum_steps(),
            seed: cfg.seed,
            shuffle: false,
        };
        let mut loader = DataLoader::new(shared.train.clone(), loader_config)?;
        // A resumed run takes its weights from the state; `--init-from` then only names the
        // shape (which must be the state's), so its weights are not read.
        if let (Some(path), None) = (&cfg.init_from, &cfg.resume) {
            load_init(path, &shared.model, &mut engine)?;
        }
        let start = match &cfg.resume {
            Some(dir) => resume(shared, dir, rank, &mut engine, &mut loader)?,
            None => 0,
        };
        let schedule = CosineSchedule {
            max_lr: cfg.lr,
            warmup_steps: cfg.warmup_steps.min(cfg.steps),
            total_steps: cfg.steps,
            min_lr_frac: cfg.min_lr_ratio,
        };
        schedule.validate()?;
        let params = model.layout().num_params();
        let mut out = RankOutput::new(&engine, acts.bytes(), params, cfg.precision.into())?;
        // Split over a tensor-parallel group, the rank holds a part of the model: the run
        // reports the whole model's parameters, each rank under its world rank.
        out.num_params = ParamLayout::new(&shared.model).num_params();
        out.report.rank = rank;
        let train = TrainStep::new(model.layout(), acts.checkpoint_every())?;
        Ok(Self {
            acts,
            train,
            x: vec![0; b * t],
            y: vec![0; b * t],
            shared,
            rank,
            model,
            engine,
            loader,
            loader_config,
            schedule,
            start,
            out,
            traffic: Traffic::default(),
            sent: 0,
            received: 0,
            tp_traffic: TpCounter::default(),
            file_io: zero::FileIo::default(),
            pending_save: None,
            diverge: false,
            trace: None,
        })
    }

    /// The step this rank starts from.
    pub(crate) fn start(&self) -> u64 {
        self.start
    }

    /// One optimizer step (`step` counts from 0): forward and backward over every micro-batch
    /// of the global batch, the loss averaged over ranks, the engine's update at the
    /// schedule's learning rate. Rank 0 reports it.
    ///
    /// # Errors
    /// Data, model, engine or collective errors.
    pub(crate) fn step(&mut self, step: u64) -> Result<(), TrainError> {
        self.arm_faults(step);
        let began = Instant::now();
        let (traffic_before, sent_before) = (self.engine.traffic(), self.bytes_moved());
        let files_before = self.engine.file_io();
        let tp_before = self.engine.tensor_parallel().map(|tp| tp.stats());
        let lr = self.schedule.lr(step);
        let accum = self.loader_config.grad_accum_steps;
        let arena_before = self.engine.arena().stats();
        let mut local = 0.0f32;
        for _ in 0..accum {
            self.loader.next_micro_batch(&mut self.x, &mut self.y)?;
            local += match std::mem::take(&mut self.diverge) {
                true => self.diverged_micro_step()?,
                false => self.train.run(
                    &mut self.engine,
                    &self.model,
                    &mut self.acts,
                    &self.x,
                    &self.y,
                )?,
            };
        }
        let mut loss = [local / accum as f32];
        self.engine
            .comm()
            .all_reduce_in_place(&mut loss, ReduceOp::Avg)?;
        let report = self.engine.step(lr)?;
        self.model.backend().finish_step()?;
        self.count_traffic(traffic_before, sent_before);
        self.file_io = self.file_io.plus(self.engine.file_io().since(files_before));
        if let (Some(before), Some(tp)) = (tp_before, self.engine.tensor_parallel()) {
            self.tp_traffic.add(&before, &tp.stats());
        }
        let secs = began.elapsed().as_secs_f64();
        self.out.losses.push(loss[0]);
        let global_tokens = (self.shared.cfg.batch_size * self.shared.cfg.seq_len) as f64;
        let arena = self.engine.arena().stats();
        let m = StepMetrics {
            peak_bytes: arena.peak_allocated as u64,
            plan_bytes: self.engine.memory_plan().total(),
            staging_outside_bytes: self.engine.comm().staging_outside_bytes(),
            resident: crate::run::resident::resident(),
            defrags: arena.defrags - arena_before.defrags,
            defrag_bytes_moved: arena.bytes_moved - arena_before.bytes_moved,
            step: step + 1,
            loss: loss[0],
            lr,
            grad_norm: report.grad_norm,
            tokens_per_s: global_tokens / secs,
            step_ms: secs * 1e3,
            loss_scale: report.loss_scale,
            skipped: report.skipped,
        };
        if self.rank == 0 {
            self.shared.reporter.step(&m)?;
        }
        Ok(())
    }

    /// Bytes sent and received so far, as zero-comm counts them.
    fn bytes_moved(&self) -> (u64, u64) {
        let stats = self.engine.comm().stats();
        (stats.bytes_sent, stats.bytes_received)
    }

    /// Adds the traffic since `before` / `sent_before` to the run's totals.
    fn count_traffic(&mut self, before: Traffic, sent_before: (u64, u64)) {
        let after = self.engine.traffic();
        self.traffic.all_reduce += after.all_reduce - before.all_reduce;
        self.traffic.reduce_scatter += after.reduce_scatter - before.reduce_scatter;
        self.traffic.all_gather += after.all_gather - before.all_gather;
        let now = self.bytes_moved();
        self.sent += now.0 - sent_before.0;
        self.received += now.1 - sent_before.1;
    }

    /// Mean validation loss over `eval_batches` global batches from the start of val.bin,
    /// recorded as the loss after `step` steps; rank 0 reports it.
    ///
    /// # Errors
    /// Data, model, engine or collective errors.
    pub(crate) fn evaluate(&mut self, step: u64) -> Result<(), TrainError> {
        let Some(val) = self.shared.val.clone() else {
            return Ok(()); // --eval-every 0: no val.bin was opened
        };
        let cfg = LoaderConfig {
            grad_accum_steps: 1,
            ..self.loader_config
        };
        let mut loader = DataLoader::new(val, cfg)?;
        // The training activations serve evaluation too: same (B, T), no second set.
        let n = cfg.micro_batch * cfg.seq_len;
        let (mut x, mut y) = (vec![0u32; n], vec![0u32; n]);
        let mut sum = 0.0f32;
        let batches = self.shared.cfg.eval_batches.max(1);
        for _ in 0..batches {
            loader.next_micro_batch(&mut x, &mut y)?;
            sum += eval_loss(&mut self.engine, &self.model, &mut self.acts, &x, &y)?;
        }
        let mut mean = [sum / batches as f32];
        self.engine
            .comm()
            .all_reduce_in_place(&mut mean, ReduceOp::Avg)?;
        self.out.val_losses.push((step, mean[0]));
        if self.rank == 0 {
            self.shared.reporter.val_loss(step, mean[0])?;
        }
        Ok(())
    }

    /// Generates the closing `--sample-tokens` sample; rank 0 prints it.
    ///
    /// # Errors
    /// Engine or model errors.
    pub(crate) fn sample(&mut self) -> Result<(), TrainError> {
        let cfg = self.shared.cfg;
        if cfg.sample_tokens == 0 {
            return Ok(());
        }
        let (t, n, k) = (cfg.seq_len, cfg.sample_tokens, cfg.top_k);
        self.out.sample = sample(&mut self.engine, &self.model, t, n, k, cfg.seed)?;
        if self.rank == 0 {
            let text = decode(&self.out.sample);
            self.shared.reporter.line(&format!("sample:\n{text}"));
        }
        Ok(())
    }

    /// What this rank hands back: losses, sample, and memory and traffic per step run.
    pub(crate) fn report(mut self) -> RankOutput {
        let steps_run = self.shared.cfg.steps.saturating_sub(self.start).max(1);
        let t = self.traffic;
        let report = &mut self.out.report;
        report.peak_bytes = self.engine.arena().stats().peak_allocated as u64;
        report.optimizer_offloaded_bytes =
            (self.engine.offload_arena()).map_or(0, |a| a.stats().peak_allocated as u64);
        report.params_offloaded_bytes =
            (self.engine.offload_params_arena()).map_or(0, |a| a.stats().peak_allocated as u64);
        report.grads_arena_peak_bytes =
            (self.engine.offload_grads_arena()).map_or(0, |a| a.stats().peak_allocated as u64);
        report.traffic_per_step = Traffic {
            all_reduce: t.all_reduce / steps_run,
            reduce_scatter: t.reduce_scatter / steps_run,
            all_gather: t.all_gather / steps_run,
        };
        report.comm_bytes_sent_per_step = self.sent as f64 / steps_run as f64;
        report.comm_bytes_received_per_step = self.received as f64 / steps_run as f64;
        let f = self.file_io;
        report.file_io_per_step = zero::FileIo {
            read_bytes: f.read_bytes / steps_run,
            written_bytes: f.written_bytes / steps_run,
            read_seconds: f.read_seconds / steps_run as f64,
            write_seconds: f.write_seconds / steps_run as f64,
            pooled_bytes: f.pooled_bytes / steps_run,
        };
        report.tensor_parallel =
            (self.engine.tensor_parallel()).map(|_| self.tp_traffic.per_step(steps_run));
        // A run shorter than --trace-steps is still recording.
        let mut trace = self.trace.take().or_else(|| self.engine.take_trace());
        // The last traced step's delayed update landed after its trace was taken.
        if let (Some(trace), Some(late)) = (trace.as_mut(), self.engine.take_late_trace()) {
            trace.spans.extend(late.spans);
        }
        self.out.trace = trace;
        self.out
    }

    /// Joins and applies a pending delayed parameter update (`--delayed-param-update`),
    /// counting the file I/O its thread did and the all-gathers that apply it (stages 1-2)
    /// with the run's; nothing otherwise. (Each step's update lands in the next step, whose
    /// counts then hold it.)
    pub(crate) fn land_update(&mut self) -> Result<(), TrainError> {
        let files_before = self.engine.file_io();
        let (traffic_before, sent_before) = (self.engine.traffic(), self.bytes_moved());
        self.engine.land_delayed()?;
        self.count_traffic(traffic_before, sent_before);
        self.file_io = self.file_io.plus(self.engine.file_io().since(files_before));
        Ok(())
    }

    /// Starts recording the engine's timeline (`--trace`).
    pub(crate) fn begin_trace(&mut self) {
        self.engine.start_trace();
    }

    /// Stops recording and keeps the timeline for [`Trainer::report`].
    pub(crate) fn end_trace(&mut self) {
        self.trace = self.engine.take_trace();
    }
}
