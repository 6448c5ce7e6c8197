//! Where the reduced gradients a rank keeps live: in the engine's arena beside the stored
//! parameters, or, with [`EngineConfig::offload_gradients`] (ZeRO-Offload's gradient
//! offload), in the offloaded optimizer's host arena, so that the rank's arena holds no
//! gradient between a bucket's landing and the step.
//!
//! The data flow with the gradients offloaded:
//! 1. backward rounds a unit's gradient into buckets in the engine's arena and launches their
//!    reductions (`backward.rs`), as without offload;
//! 2. when a bucket's reduction lands, each segment this rank keeps is added into the unit's
//!    host block by the element loop of every other accumulation: straight from the bucket
//!    when the engine's arena is host memory (`HostKernels::accumulate_across`); from a
//!    GPU's arena, through a landing block of the host arena it is first copied into with
//!    the arena's `read_at` ([`land_on_host`], planned as `OffloadPlan::landing`). The
//!    bucket is then freed: during backward, not after it;
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
//! On a GPU the host arenas are registered with its context, so step 2's copy goes by DMA;
//! it is a blocking copy, which waits for the reduction and does not overlap the next
//! bucket's (not run on a GPU). On the CPU the landing block would only add a copy of every
//! gradient byte (1.047x the step of `zero-train --world-size 2 --zero-stage 2
//! --offload-optimizer --offload-gradients`, docs/zero.md).

use super::engine::{Engine, EngineConfig};
use super::error::{Error, Result};
use super::kernels::{HostKernels, Kernels, Span};
use super::planning::offload_plan::OffloadPlan;
use super::planning::plan::{host_backing, optimizer_host_config};
use super::transient::free_after;
use super::unit_buffers::alloc_of;
use zero_alloc::{Arena, ArenaConfig, Device};
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
    /// arena's blocks (`files`: a file tier is on), registered with the GPU's context when
    /// the rank's arena is on `device`'s; `None` otherwise.
    pub fn start(plan: &OffloadPlan, files: bool, device: Device) -> Result<Option<Self>> {
        if !plan.grads_apart {
            return Ok(None);
        }
        let capacity = usize::try_from(plan.grads_arena()).unwrap_or(usize::MAX);
        let config = ArenaConfig {
            backing: host_backing(device),
            ..optimizer_host_config(capacity, files)
        };
        Ok(Some(Self {
            arena: Arena::new(config)?,
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
        let (host, kernels) = match (self.host_grads.as_mut(), self.offloaded.as_mut()) {
            (Some(g), _) => (&mut g.arena, &g.kernels),
            (None, Some(o)) if self.config.offload_gradients => (&mut o.arena, &o.kernels),
            _ => return self.kernels.accumulate(&mut self.arena, dtype, acc, piece),
        };
        match self.arena.device() {
            Device::Cpu => kernels.accumulate_across((host, acc), (&self.arena, piece), dtype),
            Device::Cuda(_) => land_on_host((host, kernels), acc, (&self.arena, piece), dtype),
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

/// Step 2 from a device's arena: copies `piece` of `from` into a landing block of `host`
/// with the arena's `read_at` (a device-to-host copy), adds it into `acc` by the element
/// loop of every accumulation, and frees the block.
fn land_on_host(
    (host, kernels): (&mut Arena, &HostKernels),
    acc: Span,
    (from, piece): (&Arena, Span),
    dtype: DType,
) -> Result<()> {
    let bytes = piece.len * dtype.size();
    let landing = alloc_of(host, dtype, piece.len)?;
    let added = (|| {
        let view = host.slice_mut::<u8>(landing)?;
        let view = view.get_mut(..bytes).ok_or_else(|| short_landing(bytes))?;
        from.read_at(piece.block, piece.start * dtype.size(), view)?;
        let landed = Span::new(landing, 0..piece.len);
        kernels.accumulate(host, dtype, acc, landed)
    })();
    free_after(host, landing, added)
}

fn short_landing(bytes: usize) -> Error {
    Error::BadSpan {
        kernel: "gradient landing",
        message: format!("a landing block shorter than {bytes} bytes"),
    }
}

/// Refuses `offload_gradients` without the optimizer offloaded, whose host update reads
/// them.
pub(crate) fn check_grad_offload(config: &EngineConfig) -> Result<()> {
    if !config.offload_gradients || config.offload_optimizer {
        return Ok(());
    }
    Err(Error::Config(
        "gradient offload (--offload-gradients) needs the optimizer offloaded \
         (--offload-optimizer cpu or nvme): its host update reads the gradients"
            .into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use zero_alloc::Handle;

    /// A host arena holding `values` as f32 in one block.
    fn holding(values: &[f32]) -> (Arena, Handle) {
        let mut arena = Arena::new(ArenaConfig::new(1 << 16)).unwrap();
        let h = arena.alloc_elems::<f32>(values.len()).unwrap();
        arena.slice_mut::<f32>(h).unwrap().copy_from_slice(values);
        (arena, h)
    }

    /// The landing path (a GPU arena's) on two host arenas: elements 3..8 of the bucket are
    /// added into elements 2..7 of the gradients, each sum as a plain loop computes it, the
    /// rest untouched; the landing block is freed, and an inf is flagged.
    #[test]
    fn a_landed_segment_is_added_through_a_block_that_is_freed() {
        let bucket: Vec<f32> = (0..10).map(|i| 0.5 * i as f32).collect();
        let grads: Vec<f32> = (0..9).map(|i| 1.0 + i as f32).collect();
        let (from, b) = holding(&bucket);
        let (mut host, g) = holding(&grads);
        let before = host.stats().allocated;
        let kernels = HostKernels::default();
        let acc = Span::new(g, 2..7);
        let piece = Span::new(b, 3..8);
        land_on_host((&mut host, &kernels), acc, (&from, piece), DType::F32).unwrap();
        let mut want = grads.clone();
        for k in 0..5 {
            want[2 + k] = grads[2 + k] + bucket[3 + k];
        }
        assert_eq!(host.slice::<f32>(g).unwrap(), &want[..]);
        assert_eq!(host.stats().allocated, before, "the landing block was kept");
        assert!(host.stats().peak_allocated > before, "nothing was landed");
        assert!(!kernels.take_overflow(&mut host).unwrap());
        let (from, b) = holding(&[f32::INFINITY]);
        let acc = Span::new(g, 0..1);
        land_on_host(
            (&mut host, &kernels),
            acc,
            (&from, Span::new(b, 0..1)),
            DType::F32,
        )
        .unwrap();
        assert!(
            kernels.take_overflow(&mut host).unwrap(),
            "an inf went unflagged"
        );
    }
}
