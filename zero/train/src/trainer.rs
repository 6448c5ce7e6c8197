//! One rank's training state and the four things a training loop does with it: [`step`],
//! [`evaluate`], [`save`] and [`report`] (plus the closing export and sample).
//!
//! [`step`]: Trainer::step
//! [`evaluate`]: Trainer::evaluate
//! [`save`]: Trainer::save
//! [`report`]: Trainer::report

use super::bridge::{
    activation_arena_bytes, arena_activations, eval_loss, gpt_engine_on, micro_step, Placement,
};
use super::checkpoint::{LlmcStreamWriter, ModelShape};
use super::error::TrainError;
use super::init::load_init;
use super::memory_fit::MemoryQuery;
use super::metrics::{RankReport, StepMetrics};
use super::resume::{finish_save, load_state, start_state_save, PendingSave};
use super::run::{RankOutput, Shared};
use super::sample::{decode, sample};
use crate::data::{DataLoader, LoaderConfig};
use std::time::Instant;
use zero::optim::{AdamW, CosineSchedule};
use zero::{
    expected_model_state_bytes, Engine, EngineConfig, EngineOps, PlanShape, Precision, Traffic,
    ZeroStage,
};
use zero_comm::{Communicator, ReduceOp};
use zero_gpt::{init_unit, Activations, CpuBackend, Gpt};

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
    /// Input and target tokens of one micro-batch, (B, T).
    x: Vec<u32>,
    y: Vec<u32>,
    /// The step the run starts from (0, or the resumed state's).
    start: u64,
    out: RankOutput,
    /// Collective traffic and bytes sent by the steps run so far.
    traffic: Traffic,
    sent: u64,
    /// An `--async-save` whose pieces are being written, and when it started.
    pending_save: Option<(PendingSave, Instant)>,
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
    /// its stage and for stage 0.
    fn new(engine: &Engine, num_params: usize, precision: Precision) -> Result<Self, TrainError> {
        Ok(Self {
            num_params,
            losses: Vec::new(),
            val_losses: Vec::new(),
            sample: Vec::new(),
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
                activation_bytes: 0,
                activation_offloaded_bytes: 0,
                traffic_per_step: Traffic::default(),
                comm_bytes_sent_per_step: 0.0,
            },
        })
    }
}

/// The engine over `comm` with the GPT's units on `ops`, initialised from `cfg.seed`.
fn build_engine<B: Placement>(
    shared: &Shared<'_>,
    comm: Communicator,
    model: &Gpt<B>,
    ops: EngineOps,
) -> Result<Engine, TrainError> {
    let cfg = shared.cfg;
    let engine_config = EngineConfig {
        stage: cfg.zero_stage,
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
        defragment: !cfg.no_defragment,
        activation_bytes: activation_arena_bytes(
            &shared.model,
            cfg.micro_batch_size,
            cfg.seq_len,
            cfg.activation_placement(),
        )?,
    };
    engine_config.adam.validate()?;
    if let Some(limit) = engine_config.memory_limit {
        refuse_what_cannot_fit(
            shared,
            &engine_config,
            (comm.size(), comm.staging_rule()),
            limit,
        )?;
    }
    let (gcfg, layout) = (shared.model, model.layout());
    let mut init_err = None;
    let engine = gpt_engine_on(
        comm,
        layout,
        cfg.activation_placement().checkpoint_every,
        engine_config,
        ops,
        |unit, w| {
            if let Err(e) = init_unit(&gcfg, layout, unit, cfg.seed, w) {
                init_err.get_or_insert(e);
            }
        },
    )?;
    match init_err {
        Some(e) => Err(e.into()),
        None => Ok(engine),
    }
}

/// Refuses at start-up a cap below the plan (model states, transient unit buffers and
/// activations), naming the bytes needed and a stage and options that fit.
fn refuse_what_cannot_fit(
    shared: &Shared<'_>,
    engine_config: &EngineConfig,
    (world, staging): (usize, zero_comm::StagingRule),
    limit: u64,
) -> Result<(), TrainError> {
    let cfg = shared.cfg;
    let query = MemoryQuery {
        model: shared.model,
        micro_batch: cfg.micro_batch_size,
        seq_len: cfg.seq_len,
        placement: cfg.activation_placement(),
        shape: PlanShape {
            world,
            stage: engine_config.stage,
            precision: engine_config.precision,
            persistence_threshold: engine_config.persistence_threshold,
            prefetch_units: engine_config.prefetch_units,
            reduce_bucket_bytes: engine_config.reduce_bucket_bytes,
            activation_bytes: engine_config.activation_bytes,
            staging,
        },
    };
    let needed = query.plan()?.total();
    if needed <= limit {
        return Ok(());
    }
    Err(zero::Error::DoesNotFit {
        stage: engine_config.stage,
        needed,
        limit,
        hint: query.what_fits(limit),
    }
    .into())
}

impl<'a, B: Placement> Trainer<'a, B> {
    /// Builds rank `comm.rank()`'s engine on `ops` and its data loader for `model`, and loads
    /// `--init-from` and `--resume` when given.
    ///
    /// # Errors
    /// Model, engine, data or checkpoint errors; [`TrainError::Resume`] when the resumed
    /// state is past `--steps`.
    pub(crate) fn new(
        shared: &'a Shared<'a>,
        comm: Communicator,
        model: Gpt<B>,
        ops: EngineOps,
    ) -> Result<Self, TrainError> {
        let cfg = shared.cfg;
        let (rank, world) = (comm.rank(), comm.size());
        let mut engine = build_engine(shared, comm, &model, ops)?;
        let (b, t) = (cfg.micro_batch_size, cfg.seq_len);
        // First in the arena after the model states, so these pinned blocks leave no hole.
        let acts = arena_activations(&mut engine, &model, b, t, cfg.activation_placement())?;
        let loader_config = LoaderConfig {
            micro_batch: b,
            seq_len: t,
            rank,
            world_size: world,
            grad_accum_steps: cfg.grad_accum_steps(),
            seed: cfg.seed,
            shuffle: false,
        };
        let mut loader = DataLoader::new(shared.train.clone(), loader_config)?;
        if let Some(path) = &cfg.init_from {
            load_init(path, &shared.model, &mut engine)?;
        }
        let mut start = 0;
        if let Some(dir) = &cfg.resume {
            let began = Instant::now();
            start = load_state(dir, &shared.model, &mut engine, &mut loader)?;
            if rank == 0 {
                shared.reporter.line(&format!(
                    "resumed from {} at step {start} ({:.0} ms on rank 0)",
                    dir.display(),
                    began.elapsed().as_secs_f64() * 1e3
                ));
            }
            if start > cfg.steps {
                return Err(TrainError::Resume {
                    dir: dir.clone(),
                    reason: format!("its state is at step {start}, past --steps {}", cfg.steps),
                });
            }
        }
        let schedule = CosineSchedule {
            max_lr: cfg.lr,
            warmup_steps: cfg.warmup_steps.min(cfg.steps),
            total_steps: cfg.steps,
            min_lr_frac: cfg.min_lr_ratio,
        };
        schedule.validate()?;
        let out = RankOutput::new(&engine, model.layout().num_params(), cfg.precision.into())?;
        Ok(Self {
            acts,
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
            pending_save: None,
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
        let began = Instant::now();
        let (traffic_before, sent_before) = (self.engine.traffic(), self.bytes_sent());
        let lr = self.schedule.lr(step);
        let accum = self.loader_config.grad_accum_steps;
        let arena_before = self.engine.arena().stats();
        let mut local = 0.0f32;
        for _ in 0..accum {
            self.loader.next_micro_batch(&mut self.x, &mut self.y)?;
            local += micro_step(
                &mut self.engine,
                &self.model,
                &mut self.acts,
                &self.x,
                &self.y,
            )?;
        }
        let mut loss = [local / accum as f32];
        self.engine
            .comm()
            .all_reduce_in_place(&mut loss, ReduceOp::Avg)?;
        let report = self.engine.step(lr)?;
        self.count_traffic(traffic_before, sent_before);
        let secs = began.elapsed().as_secs_f64();
        self.out.losses.push(loss[0]);
        let global_tokens = (self.shared.cfg.batch_size * self.shared.cfg.seq_len) as f64;
        let arena = self.engine.arena().stats();
        let m = StepMetrics {
            peak_bytes: arena.peak_allocated as u64,
            plan_bytes: self.engine.memory_plan().total(),
            staging_outside_bytes: self.engine.comm().staging_outside_bytes(),
            resident: crate::resident::resident(),
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

    fn bytes_sent(&self) -> u64 {
        self.engine.comm().stats().bytes_sent
    }

    /// Adds the traffic since `before` / `sent_before` to the run's totals.
    fn count_traffic(&mut self, before: Traffic, sent_before: u64) {
        let after = self.engine.traffic();
        self.traffic.all_reduce += after.all_reduce - before.all_reduce;
        self.traffic.reduce_scatter += after.reduce_scatter - before.reduce_scatter;
        self.traffic.all_gather += after.all_gather - before.all_gather;
        self.sent += self.bytes_sent() - sent_before;
    }

    /// Mean validation loss over `eval_batches` global batches from the start of val.bin,
    /// recorded as the loss after `step` steps; rank 0 reports it.
    ///
    /// # Errors
    /// Data, model, engine or collective errors.
    pub(crate) fn evaluate(&mut self, step: u64) -> Result<(), TrainError> {
        let cfg = LoaderConfig {
            grad_accum_steps: 1,
            ..self.loader_config
        };
        let mut loader = DataLoader::new(self.shared.val.clone(), cfg)?;
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

    /// Saves the run after `step` steps into the `--save` directory: every rank writes the
    /// states it owns, rank 0 publishes the manifest once all succeeded (collective). With
    /// `--async-save` the pieces of every save but the last are written in the background
    /// and published by the next save, which first waits for them.
    ///
    /// # Errors
    /// Engine, collective or checkpoint I/O errors, including those of the previous
    /// background save.
    pub(crate) fn save(&mut self, step: u64) -> Result<(), TrainError> {
        let cfg = self.shared.cfg;
        let Some(dir) = &cfg.save else {
            return Ok(());
        };
        if let Some((pending, began)) = self.pending_save.take() {
            self.publish(pending, began)?;
        }
        let began = Instant::now();
        let background = cfg.async_save && step < cfg.steps;
        let loader = self.loader.state();
        let (engine, model) = (&mut self.engine, &self.shared.model);
        let pending = start_state_save(engine, dir, cfg, model, &loader, step, background)?;
        if background {
            self.pending_save = Some((pending, began));
            Ok(())
        } else {
            self.publish(pending, began)
        }
    }

    /// Finishes a save and reports it.
    fn publish(&mut self, pending: PendingSave, began: Instant) -> Result<(), TrainError> {
        let (at, bytes) = finish_save(&mut self.engine, pending)?;
        if self.rank == 0 {
            self.shared.reporter.line(&format!(
                "saved {} ({bytes} bytes by rank 0, {:.0} ms from start to publication)",
                at.display(),
                began.elapsed().as_secs_f64() * 1e3
            ));
        }
        Ok(())
    }

    /// Writes `--export-llmc` (rank 0) unit by unit and waits for it; nothing without the
    /// flag. Each unit is gathered into the arena, written and freed, so the export holds one
    /// unit beyond the rank's states. A write failure on rank 0 is reported after every rank
    /// has finished the gathers, so no peer is left waiting in one.
    ///
    /// # Errors
    /// Engine, collective or checkpoint I/O errors.
    pub(crate) fn export_llmc(&mut self) -> Result<(), TrainError> {
        let Some(path) = &self.shared.cfg.export_llmc else {
            return Ok(());
        };
        let shape = ModelShape::from_config(&self.shared.model);
        let mut failure: Option<TrainError> = None;
        let mut writer = match (self.rank == 0).then(|| LlmcStreamWriter::create(path, shape)) {
            Some(Ok(w)) => Some(w),
            Some(Err(e)) => {
                failure = Some(e.into());
                None
            }
            None => None,
        };
        for unit in 0..self.engine.units().len() {
            let wrote = self.engine.with_whole_params(unit, |values| {
                writer.as_mut().map(|w| w.write_unit(unit, values))
            })?;
            if let Some(Err(e)) = wrote {
                failure.get_or_insert(e.into());
                writer = None;
            }
        }
        if let Some(Err(e)) = writer.map(LlmcStreamWriter::finish) {
            failure.get_or_insert(e.into());
        }
        self.engine.comm().barrier()?;
        failure.map_or(Ok(()), Err)
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
        report.activation_bytes = self.acts.bytes();
        report.activation_offloaded_bytes = self.acts.offloaded_bytes();
        report.traffic_per_step = Traffic {
            all_reduce: t.all_reduce / steps_run,
            reduce_scatter: t.reduce_scatter / steps_run,
            all_gather: t.all_gather / steps_run,
        };
        report.comm_bytes_sent_per_step = self.sent as f64 / steps_run as f64;
        self.out
    }
}
