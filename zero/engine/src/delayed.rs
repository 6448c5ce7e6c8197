//! DeepSpeed's delayed parameter update (ZeRO-Offload's DPU,
//! [`EngineConfig::delayed_param_update`](crate::EngineConfig), with the optimizer in the
//! host arena): the host AdamW of step t runs on a thread of its own while the model runs
//! step t+1's forward and backward on the parameters of step t-1, one step stale. It is not
//! the arithmetic of an engine without it: θ(t+1) = AdamW(θ(t), g(θ(t-1))).
//!
//! The protocol, each optimizer step:
//! 1. the pending update of the step before, if any, is joined: the host arena comes back
//!    from its thread, and each unit's updated owned parameters are copied from its host
//!    block into the stored parameters (then the all-gather of stages 1-2);
//! 2. each unit's owned gradients (storage type) and stored parameters (fp32's master copy)
//!    are copied into the unit's two host blocks, and the engine's gradients are zeroed;
//! 3. the host arena moves to a new thread, which runs every unit's AdamW on its host
//!    blocks, piece by piece, with the kernels of the offloaded update, while the engine
//!    returns to the model;
//! 4. whatever reads or writes optimizer states (an export, an import, a save, the end of a
//!    run) joins and applies the pending update first ([`Engine::land_delayed`]): the
//!    update lands early, so the next forward sees fresh parameters.
//!
//! While an update is pending the engine holds no host arena (`Engine::offloaded` is `None`):
//! nothing can touch the blocks the thread owns.

use super::engine::Engine;
use super::error::{Error, Result};
use super::kernels::{AdamWBuffers, AdamWStep, Kernels, Span};
use super::optim::{AdamW, DecaySegment};
use super::optimizer_home::OffloadedOptimizer;
use super::planning::offload_plan::piece_elems;
use super::precision::{with_store, Store};
use super::transient::free_after;
use std::thread::JoinHandle;
use zero_alloc::Handle;

/// A pending update: the thread that owns the host arena until it is joined.
pub(crate) type Pending = JoinHandle<(OffloadedOptimizer, Result<()>)>;

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
            .spawn(move || update_on_host::<S>(host, &jobs, scalars));
        let thread =
            thread.map_err(|e| Error::Order(format!("the delayed update's thread: {e}")))?;
        self.pending_update = Some(thread);
        self.progress.micro_steps = 0;
        Ok(())
    }

    /// Step 1 (and 4) of the module's protocol: joins the pending update, if any, takes the
    /// host arena back and applies the updated parameters. Without a pending update,
    /// nothing.
    ///
    /// # Errors
    /// The update's own error, a thread that panicked, arena or collective failures.
    pub fn land_delayed(&mut self) -> Result<()> {
        let Some(pending) = self.pending_update.take() else {
            return Ok(());
        };
        let (host, updated) = pending
            .join()
            .map_err(|_| Error::Order("the delayed update's thread panicked".into()))?;
        self.offloaded = Some(host);
        updated?;
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
            let host = self.offloaded.as_ref().ok_or_else(no_host)?;
            let (_, params) = host.delayed[unit];
            let bytes = &host.arena.slice::<u8>(params)?[..owned.len * elem];
            self.arena
                .write_at(self.units.bufs[unit].params, at, bytes)?;
            if policy.syncs_params_after_step() {
                self.sync_params::<S>(unit)?;
            }
        }
        Ok(())
    }

    /// Step 2: each unit's owned gradients and stored parameters into its host blocks, the
    /// engine's gradients zeroed; the thread's jobs.
    fn stage_delayed<S: Store>(&mut self) -> Result<Vec<UnitJob>> {
        let (rank, elem) = (self.rank(), std::mem::size_of::<S>());
        let mut jobs = Vec::with_capacity(self.units.specs.len());
        for unit in 0..self.units.specs.len() {
            let policy = self.units.policies[unit];
            let owned = policy.owned(rank);
            let b = &self.units.bufs[unit];
            let host = self.offloaded.as_mut().ok_or_else(no_host)?;
            let (grads, params) = host.delayed[unit];
            let bytes = owned.len * elem;
            for (from, whole, to) in [
                (b.grads, policy.whole_grads, grads),
                (b.params, policy.whole_params, params),
            ] {
                let at = policy.part.local(rank, owned, whole).start * elem;
                let view = &mut host.arena.slice_mut::<u8>(to)?[..bytes];
                self.arena.read_at(from, at, view)?;
            }
            let all = Span::new(b.grads, 0..policy.len(policy.whole_grads));
            self.kernels.fill_zero(&mut self.arena, S::DTYPE, all)?;
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
        }
        Ok(jobs)
    }
}

/// Step 3, on the thread: every unit's AdamW on its host blocks, a piece at a time through
/// one f32 scratch block; the host arena back with the outcome.
fn update_on_host<S: Store>(
    mut host: OffloadedOptimizer,
    jobs: &[UnitJob],
    s: Scalars,
) -> (OffloadedOptimizer, Result<()>) {
    let widest = jobs.iter().map(|j| j.len).max().unwrap_or(1).min(s.piece);
    let scratch = match host.arena.alloc_elems::<f32>(widest.max(1)) {
        Ok(h) => h,
        Err(e) => return (host, Err(e.into())),
    };
    let mut updated = Ok(());
    for job in jobs {
        for start in (0..job.len).step_by(s.piece) {
            let len = s.piece.min(job.len - start);
            let (own, kept) = (
                start..start + len,
                job.optim_at + start..job.optim_at + start + len,
            );
            let bufs = AdamWBuffers {
                grads: Span::new(job.grads, own.clone()),
                scratch: Span::new(scratch, 0..len),
                master: job.master.map(|h| Span::new(h, kept.clone())),
                params: Span::new(job.params, own),
                m: Span::new(job.m, kept.clone()),
                v: Span::new(job.v, kept),
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
            updated =
                updated.and_then(|()| host.kernels.adamw(&mut host.arena, S::DTYPE, &bufs, &step));
        }
    }
    let result = free_after(&mut host.arena, scratch, updated);
    (host, result)
}

/// Refuses the delayed update where it cannot run: it needs the optimizer in the host
/// arena (`offload_optimizer`, not its file tier), and the stored parameters in the engine's
/// arena (not `offload_params`).
pub(crate) fn check_delayed(config: &crate::EngineConfig) -> Result<()> {
    if !config.delayed_param_update {
        return Ok(());
    }
    let why = if !config.offload_optimizer {
        "needs the optimizer offloaded to the host (--offload-optimizer cpu): the update runs on a host thread"
    } else if config.optimizer_file {
        "runs with --offload-optimizer cpu only, not nvme: the file's stream is the step's"
    } else if config.offload_params {
        "does not run with --offload-params: the update lands in the stored parameters of the arena"
    } else {
        return Ok(());
    };
    Err(Error::Config(format!(
        "the delayed parameter update (--delayed-param-update) {why}"
    )))
}

fn no_host() -> Error {
    Error::Order("the delayed update has no host arena (offload_optimizer is off)".into())
}
