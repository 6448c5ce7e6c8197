//! DeepSpeed's delayed parameter update (ZeRO-Offload's DPU,
//! [`EngineConfig::delayed_param_update`](crate::EngineConfig), with the optimizer offloaded
//! to the host arena or its file): the host AdamW of step t runs on a thread of its own while
//! the model runs step t+1's forward and backward on the parameters of step t-1, one step
//! stale. It is not the arithmetic of an engine without it: θ(t+1) = AdamW(θ(t), g(θ(t-1))).
//!
//! The protocol, each optimizer step:
//! 1. the pending update of the step before, if any, is joined: the host arena (and the
//!    optimizer's file) comes back from its thread, and each unit's updated owned parameters
//!    are copied from its host block into the stored parameters, in the engine's arena or the
//!    offloaded parameters' home (then the all-gather of stages 1-2);
//! 2. each unit's owned gradients (storage type) and, in fp32, its stored parameters (the
//!    master copy; half precision's update writes the parameters from its master weights
//!    without reading them) are copied into the unit's two host blocks, and the kept
//!    gradients are zeroed (in the engine's arena, or with `offload_gradients` in their own
//!    host arena, `grad_home`);
//! 3. the host arena moves to a new thread, which runs every unit's AdamW on its host
//!    blocks, piece by piece, with the kernels of the offloaded update, while the engine
//!    returns to the model; with the optimizer's file, the thread streams the step's pieces
//!    of m, v and the master weights through the file's two slots (`optimizer_stream`), so
//!    the file's reads and writes overlap the next forward and backward too;
//! 4. whatever reads or writes optimizer states (an export, an import, a save, the end of a
//!    run) joins and applies the pending update first ([`Engine::land_delayed`]): the
//!    update lands early, so the next forward sees fresh parameters.
//!
//! While an update is pending the engine holds no host arena (`Engine::offloaded` is `None`):
//! nothing can touch the blocks or the file the thread owns. The thread touches neither the
//! engine's arena, nor the gradients' host arena, nor the offloaded parameters: their stored
//! shards change only in step 1, on the engine's thread, between programs.

use super::engine::Engine;
use super::error::{Error, Result};
use super::kernels::{AdamWBuffers, AdamWStep, Kernels, Span};
use super::optim::{AdamW, DecaySegment};
use super::optimizer_file::FileTierStats;
use super::optimizer_home::{OffloadedOptimizer, OptimSpans};
use super::optimizer_io::PieceId;
use super::planning::offload_plan::piece_elems;
use super::precision::{with_store, Store};
use super::trace::{Lane, Trace};
use super::transient::free_after;
use std::thread::JoinHandle;
use std::time::Instant;
use zero_alloc::Handle;

/// A pending update: the thread that owns the host arena until it is joined, and the
/// optimizer file's statistics as they stood when the thread took it (what
/// [`Engine::optimizer_file`] reports meanwhile).
#[derive(Debug)]
pub(crate) struct Pending {
    thread: JoinHandle<Finished>,
    pub file_stats: Option<FileTierStats>,
}

/// What the thread hands back: the host arena (and the file), the spans it recorded when
/// the engine traces, and how the update went.
pub(crate) struct Finished {
    host: OffloadedOptimizer,
    trace: Option<Trace>,
    result: Result<()>,
}

/// One unit's update on the thread: its host blocks and where its owned range sits.
struct UnitJob {
    /// The unit's host blocks of owned gradients and parameters (storage type).
    grads: Handle,
    params: Handle,
    master: Option<Handle>,
    m: Handle,
    v: Handle,
    /// Elements of the owned range, and where it starts in the kept optimizer blocks.
    len: usize,
    optim_at: usize,
    /// Where the owned range starts in unit coordinates, and the unit's decay segments.
    offset: usize,
    segments: Vec<DecaySegment>,
}

/// The step's scalars, as the thread reads them.
#[derive(Clone, Copy)]
struct Scalars {
    adam: AdamW,
    t: u64,
    lr: f32,
    grad_factor: f32,
    clip_coef: f32,
    piece: usize,
}

impl Engine {
    /// Steps 1-3 of the module's protocol for the gradients of the step being taken.
    pub(crate) fn delayed_update<S: Store>(
        &mut self,
        lr: f32,
        grad_factor: f32,
        clip_coef: f32,
    ) -> Result<()> {
        self.land_delayed()?;
        let jobs = self.stage_delayed::<S>()?;
        let stream = self.file_step_order();
        let trace = self.trace.is_some().then(Trace::default);
        let file_stats = self.optimizer_file();
        let host = self.offloaded.take().ok_or_else(no_host)?;
        let scalars = Scalars {
            adam: self.config.adam,
            t: self.progress.steps,
            lr,
            grad_factor,
            clip_coef,
            piece: piece_elems(self.config.reduce_bucket_bytes, self.config.precision),
        };
        let thread = std::thread::Builder::new()
            .name("zero-delayed-update".into())
            .spawn(move || update_on_host::<S>(host, &jobs, scalars, stream, trace));
        let thread =
            thread.map_err(|e| Error::Order(format!("the delayed update's thread: {e}")))?;
        self.pending_update = Some(Pending { thread, file_stats });
        self.progress.micro_steps = 0;
        Ok(())
    }

    /// Step 1 (and 4) of the module's protocol: joins the pending update, if any, takes the
    /// host arena back, keeps the thread's spans and applies the updated parameters.
    /// Without a pending update, nothing.
    ///
    /// # Errors
    /// The update's own error, a thread that panicked, arena or collective failures.
    pub fn land_delayed(&mut self) -> Result<()> {
        let Some(pending) = self.pending_update.take() else {
            return Ok(());
        };
        let finished = pending
            .thread
            .join()
            .map_err(|_| Error::Order("the delayed update's thread panicked".into()))?;
        self.offloaded = Some(finished.host);
        if let Some(theirs) = finished.trace {
            // Recording may have stopped since the thread started (the traced steps end
            // with this update in flight): its spans then wait for `take_late_trace`.
            let mine = match self.trace.as_mut() {
                Some(mine) => mine,
                None => self.late_trace.get_or_insert_with(Trace::default),
            };
            mine.spans.extend(theirs.spans);
        }
        finished.result?;
        with_store!(self.config.precision, S => self.apply_delayed::<S>())
    }

    /// Copies each unit's updated host parameters into its stored ones, and all-gathers
    /// them where parameters are whole but updated by shard.
    fn apply_delayed<S: Store>(&mut self) -> Result<()> {
        let (rank, elem) = (self.rank(), std::mem::size_of::<S>());
        for unit in 0..self.units.specs.len() {
            let policy = self.units.policies[unit];
            let owned = policy.owned(rank);
            let at = policy.part.local(rank, owned, policy.whole_params).start * elem;
            let offloaded = self.params_offloaded(unit);
            let host = self.offloaded.as_ref().ok_or_else(no_host)?;
            let (_, params) = host.delayed[unit];
            let bytes = &host.arena.slice::<u8>(params)?[..owned.len * elem];
            let stored = self.units.bufs[unit].params;
            match self.offloaded_params.as_mut().filter(|_| offloaded) {
                Some(home) => home.write(unit, stored, at, bytes)?,
                None => self.arena.write_at(stored, at, bytes)?,
            }
            if policy.syncs_params_after_step() {
                self.sync_params::<S>(unit)?;
            }
            self.read_ahead_after_update(unit)?;
        }
        Ok(())
    }

    /// Step 2: each unit's owned gradients (from the engine's arena, or their own host
    /// arena when offloaded) and (fp32) stored parameters into its host blocks, the kept
    /// gradients zeroed; the thread's jobs.
    fn stage_delayed<S: Store>(&mut self) -> Result<Vec<UnitJob>> {
        let (rank, elem) = (self.rank(), std::mem::size_of::<S>());
        let mut jobs = Vec::with_capacity(self.units.specs.len());
        for unit in 0..self.units.specs.len() {
            let policy = self.units.policies[unit];
            let owned = policy.owned(rank);
            let offloaded = self.params_offloaded(unit);
            let b = &self.units.bufs[unit];
            let host = self.offloaded.as_mut().ok_or_else(no_host)?;
            let (grads, params) = host.delayed[unit];
            let bytes = owned.len * elem;
            let grads_at = policy.part.local(rank, owned, policy.whole_grads).start * elem;
            let view = &mut host.arena.slice_mut::<u8>(grads)?[..bytes];
            // Offloaded gradients are in their own host arena (`grad_home`).
            match &self.host_grads {
                Some(g) => g.arena.read_at(b.grads, grads_at, view)?,
                None => self.arena.read_at(b.grads, grads_at, view)?,
            }
            // Half precision's update writes the parameters from the master copy without
            // reading them: only fp32's stored parameters (its master copy) are staged.
            if b.master.is_none() {
                let params_at = policy.part.local(rank, owned, policy.whole_params).start * elem;
                let view = &mut host.arena.slice_mut::<u8>(params)?[..bytes];
                match self.offloaded_params.as_mut().filter(|_| offloaded) {
                    Some(home) => home.read(unit, b.params, params_at, view)?,
                    None => self.arena.read_at(b.params, params_at, view)?,
                }
            }
            let all = Span::new(b.grads, 0..policy.len(policy.whole_grads));
            jobs.push(UnitJob {
                grads,
                params,
                master: b.master,
                m: b.m,
                v: b.v,
                len: owned.len,
                optim_at: policy.part.local(rank, owned, policy.whole_optim).start,
                offset: owned.offset,
                segments: self.units.specs[unit].decay_segments(),
            });
            let (arena, kernels) = self.grad_home();
            kernels.fill_zero(arena, S::DTYPE, all)?;
        }
        Ok(jobs)
    }
}

/// Step 3, on the thread: every unit's AdamW on its host blocks, a piece at a time through
/// one f32 scratch block, along the file's `stream` of pieces when the states are in the
/// file; the host arena back with the spans and the outcome.
fn update_on_host<S: Store>(
    mut host: OffloadedOptimizer,
    jobs: &[UnitJob],
    s: Scalars,
    stream: Option<(Vec<PieceId>, usize)>,
    mut trace: Option<Trace>,
) -> Finished {
    let result = update_units::<S>(&mut host, jobs, s, stream, trace.as_mut());
    Finished {
        host,
        trace,
        result,
    }
}

fn update_units<S: Store>(
    host: &mut OffloadedOptimizer,
    jobs: &[UnitJob],
    s: Scalars,
    stream: Option<(Vec<PieceId>, usize)>,
    mut trace: Option<&mut Trace>,
) -> Result<()> {
    let widest = jobs.iter().map(|j| j.len).max().unwrap_or(1).min(s.piece);
    let scratch = host.arena.alloc_elems::<f32>(widest.max(1))?;
    let mut updated = match (stream, host.file.as_mut()) {
        (Some((order, slot_len)), Some(file)) => file.begin_step(&mut host.arena, order, slot_len),
        _ => Ok(()),
    };
    for (unit, job) in jobs.iter().enumerate() {
        if updated.is_err() {
            break;
        }
        let start = Instant::now();
        updated = update_job::<S>(host, (unit, job), scratch, s, trace.as_deref_mut());
        if let Some(t) = trace.as_deref_mut() {
            t.span_until_now(
                format!("delayed update unit {unit}"),
                Lane::Optimizer,
                start,
            );
        }
    }
    // The update's own failure explains more than a failure to end the stream after it.
    let ended = match host.file.as_mut() {
        Some(file) => file.end_step(&mut host.arena, trace),
        None => Ok(()),
    };
    free_after(&mut host.arena, scratch, updated.and(ended))
}

/// One unit's pieces: m, v and the master weights from the unit's host blocks, or from the
/// file's slot that holds the piece.
fn update_job<S: Store>(
    host: &mut OffloadedOptimizer,
    (unit, job): (usize, &UnitJob),
    scratch: Handle,
    s: Scalars,
    mut trace: Option<&mut Trace>,
) -> Result<()> {
    if host.file.is_some() {
        super::optimizer_stream::starts_at_a_piece(unit, job.optim_at)?;
    }
    for (k, start) in (0..job.len).step_by(s.piece).enumerate() {
        let len = s.piece.min(job.len - start);
        let own = start..start + len;
        let optim = match host.file.as_mut() {
            Some(file) => {
                let slot = file.next_piece(&mut host.arena, trace.as_deref_mut(), (unit, k))?;
                OptimSpans::of_slot(&slot, len)
            }
            None => {
                let kept = job.optim_at + start..job.optim_at + start + len;
                OptimSpans {
                    master: job.master.map(|h| Span::new(h, kept.clone())),
                    m: Span::new(job.m, kept.clone()),
                    v: Span::new(job.v, kept),
                }
            }
        };
        let bufs = AdamWBuffers {
            grads: Span::new(job.grads, own.clone()),
            scratch: Span::new(scratch, 0..len),
            master: optim.master,
            params: Span::new(job.params, own),
            m: optim.m,
            v: optim.v,
        };
        let step = AdamWStep {
            adam: s.adam,
            t: s.t,
            lr: s.lr,
            grad_factor: s.grad_factor,
            clip_coef: s.clip_coef,
            offset: job.offset + start,
            segments: &job.segments,
        };
        host.kernels
            .adamw(&mut host.arena, S::DTYPE, &bufs, &step)?;
        if let Some(file) = host.file.as_mut() {
            file.piece_done(&mut host.arena)?;
        }
    }
    Ok(())
}

/// Refuses the delayed update where it cannot run: it needs the optimizer offloaded (to the
/// host arena or its file), whose host arena the thread takes.
pub(crate) fn check_delayed(config: &crate::EngineConfig) -> Result<()> {
    if !config.delayed_param_update || config.offload_optimizer {
        return Ok(());
    }
    Err(Error::Config(
        "the delayed parameter update (--delayed-param-update) needs the optimizer offloaded \
         (--offload-optimizer cpu or nvme): the update runs on a host thread"
            .into(),
    ))
}

fn no_host() -> Error {
    Error::Order("the delayed update has no host arena (offload_optimizer is off)".into())
}
