//! Where a rank's optimizer states live: in the engine's arena beside the other model states,
//! or, with ZeRO-Offload ([`EngineConfig::offload_optimizer`](crate::EngineConfig)), in a
//! host arena of their own, updated there by host loops, or, with the file tier
//! ([`EngineConfig::optimizer_file`](crate::EngineConfig)), in one file per rank, streamed
//! through that host arena (`optimizer_file`, `optimizer_stream`).
//!
//! The offloaded states are the f32 master weights (half precision) and Adam's m and v of the
//! range the stage has a rank keep: the whole unit at stage 0, its shard at stages 1-3. The
//! engine's arena keeps the stored parameters and the reduced gradients, so forward, backward
//! and the reductions run as without offload, and every pass that reads or writes an
//! optimizer state goes through [`Engine::optimizer_home`] or
//! [`Engine::read_optim`] / [`Engine::write_optim`], the places that know where they are.
//!
//! One unit's offloaded update ([`Engine::update_offloaded`]), after the global norm, piece
//! by piece of the range the rank owns (a gradient bucket's worth each, so the host staging
//! is bounded whatever the unit's size):
//! 1. the piece of the reduced gradients (storage type) is copied from the engine's
//!    arena into a host staging block; with `offload_gradients` they landed in the host
//!    arena during backward (`grad_home`), and the update reads them there;
//! 2. fp32 only, where the stored parameters are Adam's master copy: their piece too;
//! 3. [`HostKernels::adamw`](crate::HostKernels) updates the host blocks: the code a host
//!    engine without offload runs, so the two give the same parameters to the bit; with
//!    the file tier, m, v and the master weights are a slot the piece was read into from
//!    the file, written back after;
//! 4. the updated parameters (rounded for half precision) are copied back into the piece of
//!    the stored parameters. The step's all-gather follows the unit's last piece, as
//!    without offload.
//!
//! The copies between the arenas are the arena's blocking byte copies (a device-to-host and a
//! host-to-device copy on a CUDA arena), one piece after the other; only the file's reads and
//! writes overlap the update (`optimizer_stream`, across the step's units). Not built:
//! overlapping the arena copies with the update of the previous piece. DeepSpeed's one-step
//! delayed update, which overlaps the whole host update with the next forward and backward,
//! is `delayed`.

use super::collectives::Collectives;
use super::engine::{Engine, EngineConfig};
use super::error::{Error, Result};
use super::kernels::{AdamWBuffers, AdamWStep, HostKernels, Kernels, Span};
use super::optimizer_file::FileStates;
use super::param_home::OffloadedParams;
use super::planning::offload_plan::{piece_elems, FileLayout, OffloadPlan};
use super::planning::plan::{host_backing, optimizer_host_config};
use super::planning::policy::UnitPolicy;
use super::precision::Store;
use super::unit_buffers::{alloc_of, UnitBuffers};
use std::path::Path;
use zero_alloc::{Arena, ArenaConfig, Device, Handle};
use zero_comm::{Communicator, DType, StagingRule};

/// The host arena of offloaded optimizer states, and the kernels that compute on it; with
/// the file tier, the file, and the accounting arena holding the states' handles.
#[derive(Debug)]
pub(crate) struct OffloadedOptimizer {
    pub arena: Arena,
    pub kernels: HostKernels,
    /// The states' file (`--offload-optimizer nvme`); `arena` then holds only staging.
    pub file: Option<FileStates>,
    /// With `file`: an accounting arena (no memory) whose blocks mirror the file's states,
    /// so the units keep handles whose sizes are measured as in any other home.
    pub layout: Option<Arena>,
    /// With the delayed parameter update: each unit's host blocks of owned gradients and
    /// parameters (`delayed`); empty otherwise.
    pub delayed: Vec<(Handle, Handle)>,
}

impl OffloadedOptimizer {
    /// The host arena `plan` asks for, capped by `config.host_memory_limit` (refused below
    /// the plan with the bytes needed), registered with the GPU's context when the other
    /// model states are on one (so the driver copies by DMA, not through its staging); with
    /// `config.optimizer_file`, the rank's file under `nvme_path` for `policies`' states.
    pub fn start(
        plan: OffloadPlan,
        config: &EngineConfig,
        states_on: Device,
        nvme_path: Option<&Path>,
        policies: &[UnitPolicy],
        (rank, world): (usize, usize),
    ) -> Result<Self> {
        let stored = config.precision.dtype();
        // The limit is checked, never used as the size: the plan is exact, so room past it
        // would never be used, and under CUDA every byte of the arena is page-locked.
        if let Some(limit) = config.host_memory_limit.filter(|&l| l < plan.total()) {
            return Err(Error::HostDoesNotFit {
                needed: plan.total(),
                limit,
                parts: host_parts(&plan, config.optimizer_file),
            });
        }
        let capacity = plan.optimizer_arena();
        let (file, layout) = if config.optimizer_file {
            let dir = nvme_path.ok_or_else(|| {
                Error::Order(
                    "the optimizer's file tier (--offload-optimizer nvme) needs a directory \
                     (--nvme-path)"
                        .into(),
                )
            })?;
            let piece = piece_elems(config.reduce_bucket_bytes, config.precision);
            let layout = FileLayout::new(policies, config.precision, piece);
            let file = FileStates::create(dir, (rank, world), layout, config.nvme_chunk_bytes)?;
            let mirror = Arena::accounting(usize::try_from(plan.file).unwrap_or(usize::MAX))?;
            (Some(file), Some(mirror))
        } else {
            (None, None)
        };
        let backing = host_backing(states_on);
        let files = config.plan_shape(world, StagingRule::None).files();
        let config = ArenaConfig {
            backing,
            ..optimizer_host_config(usize::try_from(capacity).unwrap_or(usize::MAX), files)
        };
        let mut arena = Arena::new(config)?;
        let delayed = match plan.delayed {
            0 => Vec::new(),
            _ => delayed_blocks(&mut arena, stored, policies, rank)?,
        };
        Ok(Self {
            arena,
            kernels: HostKernels::default(),
            file,
            layout,
            delayed,
        })
    }

    /// The arena that holds the states' blocks (the accounting mirror for the file tier)
    /// and the kernels that fill its blocks.
    pub fn parts(&mut self) -> (&mut Arena, &dyn Kernels) {
        (
            self.layout.as_mut().unwrap_or(&mut self.arena),
            &self.kernels,
        )
    }
}

/// Each unit's two blocks of `dtype` as long as the range `rank` owns (at least one
/// element), for the delayed parameter update.
fn delayed_blocks(
    arena: &mut Arena,
    dtype: DType,
    policies: &[UnitPolicy],
    rank: usize,
) -> Result<Vec<(Handle, Handle)>> {
    policies
        .iter()
        .map(|p| {
            let len = p.owned(rank).len.max(1);
            Ok((alloc_of(arena, dtype, len)?, alloc_of(arena, dtype, len)?))
        })
        .collect()
}

/// The arena that holds some model states, with the collectives that move its blocks:
/// `None` for the offloaded host arena, whose states are gathered into heap buffers through
/// `comm` (host slices), so that the arena, page-locked under CUDA, holds no gather block.
pub(crate) struct StateHome<'a> {
    pub arena: &'a mut Arena,
    pub collectives: Option<&'a mut dyn Collectives>,
    pub comm: &'a Communicator,
}

impl Engine {
    /// Where the master weights and moments are: the offloaded host arena, or the engine's.
    pub(crate) fn optimizer_home(&mut self) -> StateHome<'_> {
        match &mut self.offloaded {
            Some(o) => StateHome {
                arena: o.layout.as_mut().unwrap_or(&mut o.arena),
                collectives: None,
                comm: &self.comm,
            },
            None => StateHome {
                arena: &mut self.arena,
                collectives: Some(self.collectives.as_mut()),
                comm: &self.comm,
            },
        }
    }

    /// The engine's own arena (stored parameters, gradients, transients).
    pub(crate) fn device_home(&mut self) -> StateHome<'_> {
        StateHome {
            arena: &mut self.arena,
            collectives: Some(self.collectives.as_mut()),
            comm: &self.comm,
        }
    }

    /// The arena of the master weights and moments (the file tier's accounting mirror),
    /// read-only.
    pub(crate) fn optimizer_arena(&self) -> &Arena {
        match &self.offloaded {
            Some(o) => o.layout.as_ref().unwrap_or(&o.arena),
            None => &self.arena,
        }
    }

    /// The host arena of the offloaded optimizer states (`None` without offload): its
    /// statistics and peak.
    pub fn offload_arena(&self) -> Option<&Arena> {
        self.offloaded.as_ref().map(|o| &o.arena)
    }

    /// Steps 1-4 of the module's data flow for `unit`, with `step`'s scalars, piece by piece
    /// of the owned range ([`piece_elems`]); from and back to the file with the file tier
    /// (`optimizer_stream`).
    pub(crate) fn update_offloaded<S: Store>(
        &mut self,
        unit: usize,
        step: &AdamWStep<'_>,
    ) -> Result<()> {
        let (policy, rank) = (self.units.policies[unit], self.rank());
        let owned = policy.owned(rank);
        let piece = piece_elems(self.config.reduce_bucket_bytes, self.config.precision);
        let b = &self.units.bufs[unit];
        let mut device = DeviceSide {
            arena: &mut self.arena,
            params: (self.offloaded_params.as_mut())
                .filter(|_| policy.gathered())
                .map(|home| (home, unit)),
            grads_on_host: self.config.offload_gradients,
        };
        let first = Piece {
            grads: policy.part.local(rank, owned, policy.whole_grads).start,
            params: policy.part.local(rank, owned, policy.whole_params).start,
            optim: policy.part.local(rank, owned, policy.whole_optim).start,
            len: 0,
        };
        let Some(host) = self.offloaded.as_mut() else {
            return Err(Error::Order("offloaded update without offload".into()));
        };
        if host.file.is_some() {
            return super::optimizer_stream::update_from_file::<S>(
                &mut device,
                host,
                (unit, b),
                (first, owned.len),
                step,
                self.trace.as_mut(),
            );
        }
        let stage = Staging::new(
            &mut host.arena,
            S::DTYPE,
            owned.len.min(piece),
            device.grads_on_host,
        )?;
        let mut updated = Ok(());
        for start in (0..owned.len).step_by(piece) {
            let at = first.advanced(start, piece.min(owned.len - start));
            let step = AdamWStep {
                offset: step.offset + start,
                ..*step
            };
            let kept = at.optim..at.optim + at.len;
            let optim = OptimSpans {
                master: b.master.map(|h| Span::new(h, kept.clone())),
                m: Span::new(b.m, kept.clone()),
                v: Span::new(b.v, kept),
            };
            let host_parts = (&mut host.arena, &host.kernels);
            updated = update_piece::<S>(&mut device, host_parts, &stage, b, at, optim, &step);
            if updated.is_err() {
                break;
            }
        }
        // The update's own failure explains more than a failure to free after it.
        let freed = stage.free(&mut host.arena);
        updated.and(freed)
    }
}

/// One piece of an owned range: where it starts in each block (elements), and its length.
#[derive(Clone, Copy)]
pub(crate) struct Piece {
    pub grads: usize,
    pub params: usize,
    pub optim: usize,
    pub len: usize,
}

impl Piece {
    /// The piece of `len` elements `start` elements after `self`'s start.
    pub fn advanced(self, start: usize, len: usize) -> Self {
        Self {
            grads: self.grads + start,
            params: self.params + start,
            optim: self.optim + start,
            len,
        }
    }
}

/// Where one piece's optimizer states are in the host arena: the units' own blocks, or a
/// staging slot the file was read into.
pub(crate) struct OptimSpans {
    pub master: Option<Span>,
    pub m: Span,
    pub v: Span,
}

impl OptimSpans {
    /// The first `len` elements of a file slot's blocks (m, v, then the master weights
    /// when the slot has them).
    pub fn of_slot(slot: &[Handle], len: usize) -> Self {
        let span = |i: usize| Span::new(slot[i], 0..len);
        Self {
            m: span(0),
            v: span(1),
            master: (slot.len() > 2).then(|| span(2)),
        }
    }
}

/// The engine's arena, and where a unit's stored parameters are: there too, or in the
/// offloaded parameters' home (with the unit's number); and whether its reduced gradients
/// are in the engine's arena or already in the host arena (`grad_home`).
pub(crate) struct DeviceSide<'a> {
    pub arena: &'a mut Arena,
    pub params: Option<(&'a mut OffloadedParams, usize)>,
    pub grads_on_host: bool,
}

/// Steps 1-4 for one piece of a unit, through `stage`'s host blocks and the states `optim`
/// points at, in `host`'s arena.
pub(crate) fn update_piece<S: Store>(
    device: &mut DeviceSide<'_>,
    (host, kernels): (&mut Arena, &HostKernels),
    stage: &Staging,
    b: &UnitBuffers,
    at: Piece,
    optim: OptimSpans,
    step: &AdamWStep<'_>,
) -> Result<()> {
    let elem = std::mem::size_of::<S>();
    let bytes = at.len * elem;
    let grads = match stage.grads {
        Some(staged) => {
            copy_down(
                (device.arena, b.grads, at.grads * elem),
                bytes,
                host,
                staged,
            )?;
            Span::new(staged, 0..at.len)
        }
        None => Span::new(b.grads, at.grads..at.grads + at.len),
    };
    let bufs = AdamWBuffers {
        grads,
        scratch: Span::new(stage.scratch, 0..at.len),
        master: optim.master,
        params: Span::new(stage.params, 0..at.len),
        m: optim.m,
        v: optim.v,
    };
    let params_at = at.params * elem;
    if b.master.is_none() {
        match &mut device.params {
            Some((home, unit)) => {
                let view = host.slice_mut::<u8>(stage.params)?;
                let view = view.get_mut(..bytes).ok_or_else(|| short_block(bytes))?;
                home.read(*unit, b.params, params_at, view)?;
            }
            None => copy_down(
                (device.arena, b.params, params_at),
                bytes,
                host,
                stage.params,
            )?,
        }
    }
    kernels.adamw(host, S::DTYPE, &bufs, step)?;
    match &mut device.params {
        Some((home, unit)) => {
            let view = host.slice::<u8>(stage.params)?;
            let view = view.get(..bytes).ok_or_else(|| short_block(bytes))?;
            home.write(*unit, b.params, params_at, view)
        }
        None => copy_up(
            (host, stage.params),
            bytes,
            (device.arena, b.params, params_at),
        ),
    }
}

/// The host blocks of one unit's offloaded update: parameters and, unless the gradients
/// live in the host arena already, gradients in the storage type; and the f32 gradient the
/// update reads.
pub(crate) struct Staging {
    grads: Option<Handle>,
    scratch: Handle,
    params: Handle,
}

impl Staging {
    /// The blocks for `len` elements, or none of them (what was allocated is freed on a
    /// failure); no gradient block when `grads_on_host`.
    pub fn new(arena: &mut Arena, dtype: DType, len: usize, grads_on_host: bool) -> Result<Self> {
        let elems = len.max(1);
        let mut taken = Vec::with_capacity(3);
        let mut take = |arena: &mut Arena, dtype: DType| -> Result<Handle> {
            let h = alloc_of(arena, dtype, elems)?;
            taken.push(h);
            Ok(h)
        };
        let made = (|| {
            let grads = if grads_on_host {
                None
            } else {
                Some(take(arena, dtype)?)
            };
            let scratch = take(arena, DType::F32)?;
            let params = take(arena, dtype)?;
            Ok(Self {
                grads,
                scratch,
                params,
            })
        })();
        if made.is_err() {
            for h in taken {
                arena.free(h)?;
            }
        }
        made
    }

    /// Frees the blocks; the first failure, after trying all of them.
    pub fn free(self, arena: &mut Arena) -> Result<()> {
        let blocks = self.grads.into_iter().chain([self.scratch, self.params]);
        let freed: Vec<_> = blocks.map(|h| arena.free(h)).collect();
        freed.into_iter().collect::<std::result::Result<(), _>>()?;
        Ok(())
    }
}

/// Copies `bytes` bytes from byte `at` of block `src` of `from` into the start of host
/// block `dst`.
fn copy_down(
    (from, src, at): (&Arena, Handle, usize),
    bytes: usize,
    host: &mut Arena,
    dst: Handle,
) -> Result<()> {
    let view = host.slice_mut::<u8>(dst)?;
    let view = view.get_mut(..bytes).ok_or_else(|| short_block(bytes))?;
    Ok(from.read_at(src, at, view)?)
}

/// Copies the first `bytes` bytes of host block `src` into `to`'s block `dst` from byte `at`.
fn copy_up(
    (host, src): (&Arena, Handle),
    bytes: usize,
    (to, dst, at): (&mut Arena, Handle, usize),
) -> Result<()> {
    let view = host.slice::<u8>(src)?;
    let view = view.get(..bytes).ok_or_else(|| short_block(bytes))?;
    Ok(to.write_at(dst, at, view)?)
}

/// The parts of `plan`'s host memory that are not empty, in words, for a refusal.
fn host_parts(plan: &OffloadPlan, file: bool) -> String {
    let states = match file {
        true => "the optimizer states (in the file): 0 bytes".to_string(),
        false => format!("the optimizer states {} bytes", plan.states),
    };
    // The landing block counts with the gradients in their own arena, else it shares the
    // staging's room (`OffloadPlan::transient`).
    let grads = match plan.grads_apart {
        true => plan.grads_arena(),
        false => plan.grads,
    };
    let staging = match file {
        true => "the staging of one piece of the update and the file's two slots",
        false => "the staging of one piece of the update",
    };
    let rest = [
        ("the gradients", grads),
        (staging, plan.transient()),
        ("the delayed update's blocks", plan.delayed),
        ("the parameter shards", plan.params),
        ("the parameter file's reads ahead", plan.params_read_ahead),
    ];
    let listed = rest
        .iter()
        .filter(|(_, bytes)| *bytes > 0)
        .map(|(what, bytes)| format!("{what} {bytes} bytes"));
    std::iter::once(states)
        .chain(listed)
        .collect::<Vec<_>>()
        .join(", ")
}

fn short_block(bytes: usize) -> Error {
    Error::BadSpan {
        kernel: "offload copy",
        message: format!("a staging block shorter than {bytes} bytes"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The parts a refusal lists add up to the plan's total, whichever arena holds the
    /// gradients.
    #[test]
    fn the_parts_of_a_refusal_add_up_to_what_the_host_needs() {
        for grads_apart in [false, true] {
            let plan = OffloadPlan {
                states: 1000,
                grads: 300,
                grads_apart,
                landing: 40,
                staging: 25,
                file: 0,
                params: 7,
                params_file: 0,
                params_read_ahead: 11,
                delayed: 90,
            };
            let text = host_parts(&plan, false);
            let numbers = text.split(' ').filter_map(|w| w.parse::<u64>().ok());
            assert_eq!(numbers.sum::<u64>(), plan.total(), "{text}");
        }
    }
}
