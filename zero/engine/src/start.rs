//! Start-up allocation: every unit's buffers filled with their initial values, and the
//! communicator's staging block, right after the model states.

use super::engine::EngineConfig;
use super::error::{Error, Result};
use super::host_io::write_f32;
use super::kernels::Kernels;
use super::optimizer_file::OptimState;
use super::optimizer_home::OffloadedOptimizer;
use super::planning::plan::MemoryPlan;
use super::planning::policy::UnitPolicy;
use super::transient::{free_after, free_on_error};
use super::unit_buffers::{kept_values, upload_whole, write_params, UnitBuffers};
use zero_alloc::Arena;
use zero_comm::Communicator;

/// Every unit's buffers, filled with `init`'s values as the stage keeps them. With
/// defragmentation on, the arena is then compacted, so the blocks the model borrows for good
/// next ([`Engine::lend_f32`]) sit right after the model states and split no free space.
pub(crate) fn allocate_units(
    arena: &mut Arena,
    kernels: &dyn Kernels,
    mut offloaded: Option<&mut OffloadedOptimizer>,
    policies: &[UnitPolicy],
    config: &EngineConfig,
    rank: usize,
    init: &mut impl FnMut(usize, &mut [f32]),
) -> Result<Vec<UnitBuffers>> {
    let precision = config.precision;
    let mut bufs = Vec::with_capacity(policies.len());
    for (unit, policy) in policies.iter().enumerate() {
        let optim = offloaded.as_deref_mut().map(OffloadedOptimizer::parts);
        let b = UnitBuffers::new(arena, kernels, optim, policy, precision)?;
        let mut host = vec![0f32; policy.part.numel()];
        init(unit, &mut host);
        let values = upload_whole(arena, kernels, policy, &host)?;
        let loaded = write_params(arena, kernels, policy, &b, precision, rank, values);
        free_after(arena, values, loaded)?;
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
    Ok(bufs)
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
