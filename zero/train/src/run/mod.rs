//! One training run: this process's ranks (every rank as a thread on the local backend, the
//! one rank its launcher started it as on MPI, TCP and NCCL), each driving the GPT through its
//! ZeRO engine over its own part of every global batch.
//!
//! Beside the run itself: the launcher a process joins (`launch`) and `zero-train launch`,
//! which restarts failed ranks ([`elastic`]); the device each rank computes on ([`device`]);
//! one rank's training state (`trainer`); faults injected on purpose ([`fault`]); what rank 0
//! reports (`metrics`, `progress`, `report`, [`resident`]) and the closing sample.

pub mod device;
pub mod elastic;
pub mod fault;
mod launch;
pub mod metrics;
mod pool;
mod progress;
mod report;
pub mod resident;
mod sample;
mod timeline;
pub mod tp_traffic;
mod trainer;

use crate::bridge::Placement;
use crate::checkpoint::{CheckpointError, LlmcStreamWriter};
use crate::cli::config::{Backend, TrainConfig};
use crate::data::{TokenFile, TRAIN_FILE, VAL_FILE};
use crate::error::TrainError;
use crate::run::device::{nccl_prerequisites, rank_devices, refuse_unsupported_on_gpu, RankDevice};
use crate::run::metrics::RankReport;
use crate::run::report::Reporter;
use crate::run::trainer::Trainer;
use std::sync::Arc;
use zero::EngineOps;
use zero_comm::Communicator;
use zero_gpt::{Gpt, GptConfig, TpSplit};

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

/// Everything the ranks of this process share, read-only except the reporter.
#[derive(Debug)]
pub(crate) struct Shared<'a> {
    pub(crate) cfg: &'a TrainConfig,
    pub(crate) model: GptConfig,
    pub(crate) train: Arc<TokenFile>,
    /// Opened only when the run evaluates (`--eval-every` above 0).
    pub(crate) val: Option<Arc<TokenFile>>,
    pub(crate) reporter: Reporter,
    /// The launcher's attempt (`TORCHELASTIC_RESTART_COUNT`), which faults fire in.
    pub(crate) attempt: u64,
}

/// What one rank returns.
#[derive(Debug)]
pub(crate) struct RankOutput {
    pub(crate) num_params: usize,
    pub(crate) losses: Vec<f32>,
    pub(crate) val_losses: Vec<(u64, f32)>,
    pub(crate) sample: Vec<u32>,
    pub(crate) report: RankReport,
    /// The `--trace` timeline of this rank, when asked for.
    pub(crate) trace: Option<zero::Trace>,
}

/// Runs a training job as `cfg` describes and returns its summary.
///
/// # Errors
/// Any [`TrainError`]; an invalid `cfg` before any rank starts; a rank's failure stops
/// every rank.
pub fn train(cfg: &TrainConfig) -> Result<RunSummary, TrainError> {
    // With the local backend, before any communicator or thread exists; under a launcher
    // the world size is the launcher's, so `run_group` checks once it is known.
    let model = match cfg.backend {
        Backend::Local => Some(cfg.validate()?),
        _ => None,
    };
    let mut cfg = cfg.clone();
    let from_env = crate::run::fault::from_env().map_err(crate::error::ConfigError::Invalid)?;
    cfg.inject_fault.extend(from_env);
    let group = RankGroup::new(&mut cfg)?;
    run_group(&cfg, group, model)
}

/// One rank's run on its device: the trainer of its backend, then [`run_loop`].
fn rank_main(
    shared: &Shared<'_>,
    comm: Communicator,
    device: RankDevice,
) -> Result<RankOutput, TrainError> {
    if let Some(path) = shared
        .cfg
        .export_llmc
        .as_deref()
        .filter(|_| comm.rank() == 0)
    {
        LlmcStreamWriter::check_destination(path)?;
    }
    match device {
        RankDevice::Cpu if shared.cfg.tensor_parallel_size > 1 => {
            let (group, split) = TpGroup::new(&comm, shared.cfg.tensor_parallel_size)?;
            let model = Gpt::with_vocab_parallel(shared.model, split)?;
            let (dp, tp) = (group.dp, Some(group.tp));
            run_loop(
                shared,
                Trainer::new(shared, dp, tp, model, EngineOps::host())?,
            )
        }
        RankDevice::Cpu => {
            let model = Gpt::new(shared.model)?;
            run_loop(
                shared,
                Trainer::new(shared, comm, None, model, EngineOps::host())?,
            )
        }
        #[cfg(feature = "cuda")]
        RankDevice::Cuda(rank) => {
            let (backend, ops) = rank.into_parts()?;
            let model = Gpt::with_backend(shared.model, backend)?;
            run_loop(shared, Trainer::new(shared, comm, None, model, ops)?)
        }
    }
}

/// A rank's two groups under tensor parallelism (`--tensor-parallel-size` T): its
/// data-parallel group, which its engine runs ZeRO over, and its tensor-parallel group.
struct TpGroup {
    dp: Communicator,
    tp: Communicator,
}

impl TpGroup {
    /// This world rank's groups (zero's [`Grid`](zero::tensor_parallel::Grid): world rank
    /// `dp_index * T + tp_rank`) and its place in its tensor-parallel group. Every rank of
    /// `world` calls it.
    fn new(world: &Communicator, t: usize) -> Result<(Self, TpSplit), TrainError> {
        let grid = zero::tensor_parallel::Grid::new(world, t)?;
        let split = TpSplit {
            size: t,
            rank: grid.tp.rank(),
        };
        Ok((
            Self {
                dp: grid.dp,
                tp: grid.tp,
            },
            split,
        ))
    }
}

/// llm.c's training loop: evaluate, then step, evaluating and saving at their intervals;
/// export, sample and report at the end.
fn run_loop<B: Placement>(
    shared: &Shared<'_>,
    mut trainer: Trainer<'_, B>,
) -> Result<RankOutput, TrainError> {
    let cfg = shared.cfg;
    let due = |every: u64, step: u64| every > 0 && step % every == 0;
    if cfg.eval_every > 0 {
        // The starting point of the validation curve (llm.c evaluates at step 0 too).
        trainer.evaluate(trainer.start())?;
    }
    let traced = cfg.trace.as_ref().map(|_| {
        let first = trainer.start();
        first..first.saturating_add(cfg.trace_steps)
    });
    for step in trainer.start()..cfg.steps {
        if traced.as_ref().is_some_and(|t| t.start == step) {
            trainer.begin_trace();
        }
        trainer.step(step)?;
        if traced.as_ref().is_some_and(|t| t.end == step + 1) {
            trainer.end_trace();
        }
        let (done, last) = (step + 1, step + 1 == cfg.steps);
        if last {
            // --delayed-param-update: the last step's update lands before what follows
            // reads the parameters.
            trainer.land_update()?;
        }
        if due(cfg.fingerprint_every, done) {
            trainer.fingerprint(done)?;
        }
        if cfg.eval_every > 0 && (last || due(cfg.eval_every, done)) {
            trainer.evaluate(done)?;
        }
        if last || due(cfg.save_every, done) {
            trainer.save(done)?;
        }
    }
    trainer.export_llmc()?;
    trainer.sample()?;
    Ok(trainer.report())
}

/// This process's ranks: all of them as threads (local), or the one its launcher gave it.
struct RankGroup {
    comms: Vec<Communicator>,
    /// The NCCL rank's device (`--backend nccl`), made beside the launcher's communicator.
    nccl: Option<RankDevice>,
    /// Keeps MPI initialised until the communicators are gone.
    #[cfg(feature = "mpi")]
    _mpi: Option<zero_comm::mpi::Mpi>,
}

impl RankGroup {
    /// Creates the communicators; under a launcher (mpirun, torchrun) the world size is the
    /// launcher's and replaces `cfg.world_size`.
    fn new(cfg: &mut TrainConfig) -> Result<Self, TrainError> {
        let config = cfg.comm_config()?;
        if cfg.backend == Backend::Local {
            return Ok(Self {
                comms: zero_comm::local::create_with(cfg.world_size, config)?,
                nccl: None,
                #[cfg(feature = "mpi")]
                _mpi: None,
            });
        }
        // Refusals come before joining, so no process waits for peers that already failed.
        if cfg.backend == Backend::Nccl {
            nccl_prerequisites(cfg)?;
        } else if cfg.device.is_cuda() {
            refuse_unsupported_on_gpu(cfg)?;
        }
        let joined = launch::join(cfg.backend, config)?;
        cfg.world_size = joined.control.size();
        let nccl = match cfg.backend {
            Backend::Nccl => Some(nccl_device(cfg, &joined)?),
            _ => None,
        };
        Ok(Self {
            comms: vec![joined.control],
            nccl,
            #[cfg(feature = "mpi")]
            _mpi: joined.mpi,
        })
    }

    /// After a failed run, leaves MPI unfinalised: a collective given up on may still be
    /// pending (finalising is then erroneous) and, with a peer dead under `mpirun
    /// --enable-recovery`, `MPI_Finalize` was seen to block forever (in about 1 run of 3 of a
    /// killed peer on the loaded 2-core machine). The process exits with its error instead,
    /// as the dead peer did; mpirun reports the abnormal end.
    fn abandon_mpi(&mut self) {
        #[cfg(feature = "mpi")]
        if let Some(mpi) = self._mpi.take() {
            std::mem::forget(mpi);
        }
    }

    /// True when this process hosts rank 0 (which reports).
    fn hosts_rank_zero(&self) -> bool {
        self.comms.first().is_some_and(|c| c.rank() == 0)
    }
}

/// This process's NCCL rank, on the GPU of its local rank.
#[cfg(feature = "cuda")]
fn nccl_device(cfg: &TrainConfig, joined: &launch::Joined) -> Result<RankDevice, TrainError> {
    crate::run::device::nccl_rank(cfg, &joined.control, joined.local_rank)
}

/// Unreachable in practice: `nccl_prerequisites` refuses NCCL without the `cuda` feature.
#[cfg(not(feature = "cuda"))]
fn nccl_device(_cfg: &TrainConfig, _joined: &launch::Joined) -> Result<RankDevice, TrainError> {
    Err(TrainError::Unsupported(
        "--backend nccl needs a build with `--features cuda`".into(),
    ))
}

/// A token file of `cfg.data`, its ids checked against the model's vocabulary.
fn open_tokens(
    cfg: &TrainConfig,
    model: &GptConfig,
    name: &str,
) -> Result<Arc<TokenFile>, TrainError> {
    let path = cfg.data.join(name);
    if !path.exists() {
        return Err(TrainError::NoData { path });
    }
    let vocab = u32::try_from(model.vocab_size).unwrap_or(u32::MAX);
    Ok(Arc::new(TokenFile::open_with_vocab(&path, vocab)?))
}

/// Runs the ranks of `group`; `model` is the shape `train` resolved before joining, or `None`
/// under a launcher, whose world size has just replaced the configured one.
fn run_group(
    cfg: &TrainConfig,
    mut group: RankGroup,
    model: Option<GptConfig>,
) -> Result<RunSummary, TrainError> {
    let model = match model {
        Some(model) => model,
        None => cfg.validate()?,
    };
    cfg.validate_world()?;
    let attempt =
        crate::run::fault::attempt_from_env().map_err(crate::error::ConfigError::Invalid)?;
    cfg.validate_faults(attempt)?;
    let devices = match group.nccl.take() {
        Some(nccl) => vec![nccl],
        None => rank_devices(cfg, group.comms.len())?,
    };
    let shared = Shared {
        cfg,
        model,
        train: open_tokens(cfg, &model, TRAIN_FILE)?,
        val: match cfg.eval_every {
            0 => None,
            _ => Some(open_tokens(cfg, &model, VAL_FILE)?),
        },
        reporter: Reporter::new(cfg, group.hosts_rank_zero())?,
        attempt,
    };
    let results = run_ranks(&shared, std::mem::take(&mut group.comms), devices);
    shared.reporter.finish_progress();
    if results.iter().any(Result::is_err) {
        group.abandon_mpi();
    }
    if results.len() > 1 {
        // Every rank's own report (a dead or hung peer is named by each survivor); the
        // error returned below is one of them.
        for (rank, result) in results.iter().enumerate() {
            if let Err(e) = result {
                eprintln!("zero-train: rank {rank}: {e}");
            }
        }
    }
    let mut outputs = first_error(results)?;
    if let Some(path) = &cfg.trace {
        timeline::write(path, cfg.world_size, &outputs)?;
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
    shared.reporter.summary(cfg, &summary)?;
    Ok(summary)
}

/// Runs `rank_main` for every communicator on its own thread, on a rayon pool of its own
/// ([`pool`]), and collects the results in rank order; a thread or pool that cannot start, or
/// a rank that panics, becomes that rank's error.
fn run_ranks(
    shared: &Shared<'_>,
    comms: Vec<Communicator>,
    devices: Vec<RankDevice>,
) -> Vec<Result<RankOutput, TrainError>> {
    let threads = pool::threads_per_rank(comms.len());
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .zip(devices)
            .map(|(comm, device)| {
                let rank = comm.rank();
                let spawned = std::thread::Builder::new().spawn_scoped(s, move || {
                    pool::on_own_pool(rank, threads, || rank_main(shared, comm, device))
                });
                (rank, spawned)
            })
            .collect();
        handles
            .into_iter()
            .map(|(rank, spawned)| match spawned {
                Err(source) => Err(TrainError::Spawn { rank, source }),
                Ok(handle) => handle.join().unwrap_or_else(|panic| {
                    let message = panic
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default();
                    Err(TrainError::RankPanicked { rank, message })
                }),
            })
            .collect()
    })
}

/// The ranks' outputs, or the error that caused the others: the first one that is not a
/// broken group, from a collective of the trainer's or of the engine's, or a save that a
/// peer failed (the peers of a failed rank usually report only that).
fn first_error(
    results: Vec<Result<RankOutput, TrainError>>,
) -> Result<Vec<RankOutput>, TrainError> {
    let mut outputs = Vec::with_capacity(results.len());
    let mut first_err = None;
    for r in results {
        match r {
            Ok(o) => outputs.push(o),
            Err(e) => {
                let broken = |e: &Option<TrainError>| {
                    matches!(
                        e,
                        Some(
                            TrainError::Comm(_)
                                | TrainError::Engine(zero::Error::Comm(_))
                                | TrainError::Checkpoint(CheckpointError::State(
                                    zero_state::StateError::PeerFailed { .. }
                                ))
                        )
                    )
                };
                if first_err.is_none() || broken(&first_err) {
                    first_err = Some(e);
                }
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None if outputs.is_empty() => {
            Err(TrainError::Unsupported("this process hosts no rank".into()))
        }
        None => Ok(outputs),
    }
}
