//! Where the reduced gradients a rank keeps live: in the engine's arena beside the stored
//! parameters, or, with [`EngineConfig::offload_gradients`] (ZeRO-Offload's gradient
//! offload), in the offloaded optimizer's host arena, so that the rank's arena holds no
//! gradient between a bucket's landing and the step.
//!
//! The data flow with the gradients offloaded:
//! 1. backward rounds a unit's gradient into buckets in the engine's arena and launches their
//!    reductions (`backward.rs`), as without offload;
//! 2. when a bucket's reduction lands, the segments this rank keeps are added from the
//!    bucket straight into the unit's host block (`HostKernels::accumulate_across`, the
//!    element loop of every other accumulation), and the bucket is freed: during backward,
//!    not after it;
//! 3. the step's overflow check, norm, update and zeroing read and write the host blocks
//!    ([`Engine::grad_home`]); the offloaded update reads each piece of gradients where it
//!    is instead of copying it into its staging (`optimizer_home`).
//!
//! Beside the delayed update (`delayed`), whose thread holds the optimizer's host arena
//! while the next backward lands gradients, the gradients live in a host arena of their own
//! ([`HostGrads`], planned as `OffloadPlan::grads_arena`); the delayed update's step 2 copies
//! each unit's owned range from there into the thread's blocks, as it copies it from the
//! engine's arena without gradient offload.
//!
//! Only arenas with host memory take part: step 2 reads the bucket's bytes in place, which a
//! CUDA arena has not (refused at start-up, [`check_grad_offload`]).

use super::engine::{Engine, EngineConfig};
use super::error::{Error, Result};
use super::kernels::{HostKernels, Kernels, Span};
use super::planning::offload_plan::OffloadPlan;
use super::planning::plan::optimizer_host_config;
use zero_alloc::{Arena, Device};
use zero_comm::DType;

/// The kept gradients' own host arena (`OffloadPlan::grads_apart`) and the kernels that
/// compute on it.
#[derive(Debug)]
pub(crate) struct HostGrads {
    pub arena: Arena,
    pub kernels: HostKernels,
}

impl HostGrads {
    /// The arena `plan` asks for when the gradients are apart, with the optimizer's host
    /// arena's blocks (`files`: a file tier is on); `None` otherwise.
    pub fn start(plan: &OffloadPlan, files: bool) -> Result<Option<Self>> {
        if !plan.grads_apart {
            return Ok(None);
        }
        let capacity = usize::try_from(plan.grads).unwrap_or(usize::MAX);
        Ok(Some(Self {
            arena: Arena::new(optimizer_host_config(capacity, files))?,
            kernels: HostKernels::default(),
        }))
    }
}

impl Engine {
    /// Every kept gradient element of `unit` (its whole padded buffer or its shard).
    pub(crate) fn kept_grads(&self, unit: usize) -> Span {
        let policy = &self.units.policies[unit];
        Span::new(
            self.units.bufs[unit].grads,
            0..policy.len(policy.whole_grads),
        )
    }

    /// The arena of the kept gradients and the kernels that compute on it.
    pub(crate) fn grad_home(&mut self) -> (&mut Arena, &dyn Kernels) {
        if let Some(g) = self.host_grads.as_mut() {
            return (&mut g.arena, &g.kernels);
        }
        match self.offloaded.as_mut() {
            Some(o) if self.config.offload_gradients => (&mut o.arena, &o.kernels),
            _ => (&mut self.arena, self.kernels.as_ref()),
        }
    }

    /// The arena of the kept gradients, read-only.
    pub(crate) fn grad_arena(&self) -> &Arena {
        if let Some(g) = &self.host_grads {
            return &g.arena;
        }
        match &self.offloaded {
            Some(o) if self.config.offload_gradients => &o.arena,
            _ => &self.arena,
        }
    }

    /// The gradients' own host arena (`None` unless they have one: gradient offload beside
    /// the delayed update): its statistics and peak.
    pub fn offload_grads_arena(&self) -> Option<&Arena> {
        self.host_grads.as_ref().map(|g| &g.arena)
    }

    /// Bytes of the kept gradients in the host arena (`offload_gradients`), measured from
    /// their blocks; 0 when they are in the engine's arena.
    ///
    /// # Errors
    /// Arena failures (a stale handle would be a bug).
    pub fn offloaded_grad_bytes(&self) -> Result<u64> {
        if !self.config.offload_gradients {
            return Ok(0);
        }
        let arena = self.grad_arena();
        let mut bytes = 0u64;
        for b in &self.units.bufs {
            bytes += arena.block(b.grads)?.size as u64;
        }
        Ok(bytes)
    }

    /// Adds `piece` of a landed bucket (in the engine's arena) into `acc` of a unit's kept
    /// gradients, wherever they live (step 2).
    pub(crate) fn accumulate_kept(&mut self, dtype: DType, acc: Span, piece: Span) -> Result<()> {
        if let Some(g) = self.host_grads.as_mut() {
            let (to, from) = ((&mut g.arena, acc), (&self.arena, piece));
            return g.kernels.accumulate_across(to, from, dtype);
        }
        match self.offloaded.as_mut() {
            Some(o) if self.config.offload_gradients => {
                o.kernels
                    .accumulate_across((&mut o.arena, acc), (&self.arena, piece), dtype)
            }
            _ => self.kernels.accumulate(&mut self.arena, dtype, acc, piece),
        }
    }

    /// Whether an accumulation on either arena saw an inf or NaN since the last call.
    pub(crate) fn take_any_overflow(&mut self) -> Result<bool> {
        let device = self.kernels.take_overflow(&mut self.arena)?;
        let host = match self.offloaded.as_mut() {
            Some(o) => o.kernels.take_overflow(&mut o.arena)?,
            None => false,
        };
        let grads = match self.host_grads.as_mut() {
            Some(g) => g.kernels.take_overflow(&mut g.arena)?,
            None => false,
        };
        Ok(device || host || grads)
    }
}

/// Refuses `offload_gradients` where it cannot run: without the optimizer offloaded (whose
/// host update reads them), or on an arena without host memory (step 2 reads buckets in
/// place).
pub(crate) fn check_grad_offload(config: &EngineConfig, device: Device) -> Result<()> {
    if !config.offload_gradients {
        return Ok(());
    }
    let why = if !config.offload_optimizer {
        "needs the optimizer offloaded (--offload-optimizer cpu or nvme): its host update reads the gradients"
    } else if device != Device::Cpu {
        "runs on the CPU only: adding a landed bucket from a GPU's arena into host memory is not built"
    } else {
        return Ok(());
    };
    Err(Error::Config(format!(
        "gradient offload (--offload-gradients) {why}"
    )))
}
