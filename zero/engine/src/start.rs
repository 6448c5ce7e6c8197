//! Start-up allocation: every unit's buffers filled with their initial values, and the
//! communicator's staging block, right after the model states.

use super::engine::EngineConfig;
use super::error::{Error, Result};
use super::grad_home::HostGrads;
use super::host_io::{stored_bytes, write_f32};
use super::kernels::Kernels;
use super::optimizer_file::OptimState;
use super::optimizer_home::OffloadedOptimizer;
use super::param_home::OffloadedParams;
use super::planning::plan::MemoryPlan;
use super::planning::policy::UnitPolicy;
use super::precision::Precision;
use super::transient::{free_after, free_on_error};
use super::unit_buffers::{kept_values, upload_whole, write_params, zeroed, UnitBuffers};
use zero_alloc::Arena;
use zero_comm::Communicator;

/// Every unit's buffers, filled with `init`'s values as the stage keeps them. With
/// defragmentation on, the arena is then compacted, so the blocks the model borrows for good
/// next ([`Engine::lend_f32`]) sit right after the model states and split no free space.
pub(crate) fn allocate_units(
    arena: &mut Arena,
    kernels: &dyn Kernels,
    (mut offloaded, mut params_home, mut host_grads): (
        Option<&mut OffloadedOptimizer>,
        Option<&mut OffloadedParams>,
        Option<&mut HostGrads>,
    ),
    policies: &[UnitPolicy],
    config: &EngineConfig,
    rank: usize,
    init: &mut impl FnMut(usize, &mut [f32]),
) -> Result<Vec<UnitBuffers>> {
    let precision = config.precision;
    let mut bufs = Vec::with_capacity(policies.len());
    for (unit, policy) in policies.iter().enumerate() {
        let len = policy.len(policy.whole_grads);
        let grads = match (host_grads.as_deref_mut(), offloaded.as_deref_mut()) {
            (Some(g), _) => Some(zeroed(&mut g.arena, &g.kernels, precision.dtype(), len)?),
            (None, Some(o)) if config.offload_gradients => {
                Some(zeroed(&mut o.arena, &o.kernels, precision.dtype(), len)?)
            }
            _ => None,
        };
        let optim = offloaded.as_deref_mut().map(OffloadedOptimizer::parts);
        let home = params_home.as_deref_mut().map(|p| &mut p.arena);
        let b = UnitBuffers::new(arena, kernels, (optim, home), grads, policy, precision)?;
        let mut host = vec![0f32; policy.part.numel()];
        init(unit, &mut host);
        let home = params_home.as_deref_mut();
        store_params(
            (arena, kernels),
            home,
            (unit, policy, &b),
            (precision, rank),
            &host,
        )?;
        if let Some(master) = b.master {
            let kept = kept_values(policy, rank, policy.whole_optim, &host);
            match offloaded.as_deref_mut() {
                Some(OffloadedOptimizer {
                    file: Some(file), ..
                }) => file.write_range(unit, OptimState::Master, 0, &kept)?,
                Some(o) => write_f32(&mut o.arena, master, 0, &kept)?,
                None => write_f32(arena, master, 0, &kept)?,
            }
        }
        bufs.push(b);
    }
    if config.defragment {
        arena.defragment()?;
    }
    arena.reset_peak();
    if let Some(o) = offloaded {
        o.arena.reset_peak();
    }
    if let Some(p) = params_home {
        p.arena.reset_peak();
    }
    Ok(bufs)
}

/// Stores a unit's whole f32 `values` (its `numel` real elements) into its stored
/// parameters as the stage keeps them, rounded for half precision: in the arena, or into
/// the offloaded parameters' `home` for a unit stage 3 gathers.
pub(crate) fn store_params(
    (arena, kernels): (&mut Arena, &dyn Kernels),
    home: Option<&mut OffloadedParams>,
    (unit, policy, b): (usize, &UnitPolicy, &UnitBuffers),
    (precision, rank): (Precision, usize),
    values: &[f32],
) -> Result<()> {
    if let Some(home) = home.filter(|_| policy.gathered()) {
        // The shard's real values then zeros, rounded: what `write_params` narrows.
        let kept = kept_values(policy, rank, false, values);
        return home.write(unit, b.params, 0, &stored_bytes(precision, &kept));
    }
    let staged = upload_whole(arena, kernels, policy, values)?;
    let written = write_params(arena, kernels, policy, b, precision, rank, staged);
    free_after(arena, staged, written)
}

/// Lends the communicator's backend its staging block for good, right after the model
/// states (a pinned block that compaction never moves), sized by the plan for the largest
/// collective the engine issues; nothing for a backend that stages nothing. Rejected: a
/// heap buffer inside the backend, which the arena's cap and peak would not see.
pub(crate) fn provide_staging(
    arena: &mut Arena,
    comm: &Communicator,
    plan: &MemoryPlan,
) -> Result<()> {
    let largest = plan.largest_collective;
    let words = match comm.staging_bytes(largest) {
        Some(0) => return Ok(()),
        Some(bytes) => usize::try_from(bytes.div_ceil(8)).ok(),
        None => None,
    };
    let words = words.ok_or_else(|| {
        Error::Order(format!(
            "staging for collectives of {largest} bytes overflows"
        ))
    })?;
    let h = arena.alloc_elems::<u64>(words)?;
    let lent = arena.lend::<u64>(h).map_err(Error::from);
    let block = free_on_error(arena, h, lent)?;
    comm.provide_staging(block, largest)?;
    Ok(())
}
