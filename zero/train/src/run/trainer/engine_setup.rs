//! The rank's engine as the run's flags configure it, and the start-up refusal of a plan above
//! the memory cap, or above the machine's available memory when no cap is given.

use crate::bridge::{gpt_engine_on, kept_inputs, model_activation_arena_bytes, Placement};
use crate::cli::config::{Backend, Device};
use crate::error::TrainError;
use crate::plan::memory_fit::{launcher_local_size, MemoryQuery};
use crate::run::Shared;
use zero::{Engine, EngineOps};
use zero_alloc::host_available_bytes;
use zero_comm::Communicator;
use zero_gpt::{init_split_unit, Gpt};

/// The engine over `comm` with the GPT's units on `ops` (this rank's, split over a
/// tensor-parallel group), initialised from `cfg.seed`.
pub(super) fn build_engine<B: Placement>(
    shared: &Shared<'_>,
    comm: Communicator,
    model: &Gpt<B>,
    ops: EngineOps,
) -> Result<Engine, TrainError> {
    let cfg = shared.cfg;
    let (b, t) = (cfg.micro_batch_size, cfg.seq_len);
    // The backend's kernel scratch is lent with the activations (`arena_activations`).
    let placement =
        cfg.activation_placement()
            .with_scratch_of(model.backend(), &shared.model, b, t)?;
    let engine_config = cfg.engine_config(
        model_activation_arena_bytes(model, b, t, placement)?,
        kept_inputs(&shared.model, b, t, placement)?,
    );
    engine_config.adam.validate()?;
    let shape = engine_config.plan_shape(comm.size(), comm.staging_rule());
    let query = MemoryQuery::for_run(cfg, shared.model, placement, shape);
    if let (true, Device::Cuda(_)) = (cfg.offload_optimizer.is_on(), cfg.device) {
        // On a GPU the host arena is host memory of its own, outside any cap or GPU budget.
        let ranks = ranks_on_this_host(cfg.backend, comm.size());
        let host = query.plan()?.offload.map_or(0, |o| o.total());
        refuse_offload_above_host(host, ranks, host_available_bytes())?;
    }
    match engine_config.memory_limit {
        Some(limit) => refuse_above_the_cap(&query, limit)?,
        // A host arena reserves its plan without committing it, so a plan larger than the
        // machine would end in the OOM killer mid-run; on a GPU, in an allocation failure
        // that names no stage that fits.
        None => {
            let ranks = ranks_sharing_memory(cfg.backend, cfg.device, comm.size());
            // On the CPU, ZeRO-Offload's host arena draws on the same memory as the rank's.
            let host_counts = matches!(cfg.device, Device::Cpu);
            let budget = model.backend().memory_budget();
            refuse_above_the_budget(&query, host_counts, ranks, budget)?;
        }
    }
    let (gcfg, layout, split) = (shared.model, model.layout(), model.tensor_parallel());
    let mut init_err = None;
    let engine = gpt_engine_on(
        comm,
        layout,
        cfg.activation_placement().checkpoint_every,
        engine_config,
        ops.with_nvme_path(cfg.nvme_path.clone()),
        |unit, w| {
            // Whole units made as at T = 1 and sliced: every T starts from the same model.
            if let Err(e) = init_split_unit(&gcfg, layout, split, unit, cfg.seed, w) {
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
fn refuse_above_the_cap(query: &MemoryQuery, limit: u64) -> Result<(), TrainError> {
    let needed = query.plan()?.total();
    if needed <= limit {
        return Ok(());
    }
    Err(zero::Error::DoesNotFit {
        stage: query.shape.stage,
        needed,
        limit,
        hint: query.what_fits(limit),
    }
    .into())
}

/// The ranks whose arenas draw on one memory: the local backend's threads (host RAM, or
/// the one GPU they share); else one process's rank on a GPU of its own, or on the CPU the
/// processes the launcher started on this host.
fn ranks_sharing_memory(backend: Backend, device: Device, comm_size: usize) -> usize {
    match (backend, device) {
        (_, Device::Cpu) => ranks_on_this_host(backend, comm_size),
        (Backend::Local, Device::Cuda(_)) => comm_size,
        (_, Device::Cuda(_)) => 1,
    }
}

/// The ranks on this host: the local backend's threads, or the processes the launcher
/// started here (1 when it does not say).
fn ranks_on_this_host(backend: Backend, comm_size: usize) -> usize {
    match backend {
        Backend::Local => comm_size,
        _ => launcher_local_size(|k| std::env::var(k).ok()).unwrap_or(1),
    }
}

/// Refuses `ranks` offloaded host arenas of `per_rank` bytes each (page-locked on a GPU run,
/// so never swapped) above the host's `available` memory (unknown: no check).
fn refuse_offload_above_host(
    per_rank: u64,
    ranks: usize,
    available: Option<u64>,
) -> Result<(), TrainError> {
    let Some(available) = available else {
        return Ok(());
    };
    let needed = per_rank.saturating_mul(u64::try_from(ranks).unwrap_or(u64::MAX));
    if needed <= available {
        return Ok(());
    }
    Err(TrainError::OffloadHostMemory {
        per_rank,
        ranks,
        available,
        read: zero_alloc::host_memory_name(),
    })
}

/// Refuses at start-up, with no cap given, a plan whose `ranks_here` arenas (all of one
/// size: data parallelism), with their offloaded optimizer's host arenas when `host_counts`
/// (they draw on the same memory), need more than the `budget` they draw on (unknown: no
/// check), naming a stage that fits.
fn refuse_above_the_budget(
    query: &MemoryQuery,
    host_counts: bool,
    ranks_here: usize,
    budget: Option<(&'static str, u64)>,
) -> Result<(), TrainError> {
    let Some((memory, available)) = budget else {
        return Ok(());
    };
    let plan = query.plan()?;
    let host = plan.offload.map_or(0, |o| o.total());
    let per_rank = plan
        .total()
        .saturating_add(if host_counts { host } else { 0 });
    let ranks = u64::try_from(ranks_here).unwrap_or(u64::MAX);
    if per_rank.saturating_mul(ranks) <= available {
        return Ok(());
    }
    Err(TrainError::MachineMemory {
        per_rank,
        ranks: ranks_here,
        memory,
        available,
        // Ranks that share the memory do not make room by being more of them.
        hint: query.what_fits_or(
            available / ranks.max(1),
            if ranks_here > 1 {
                "put fewer ranks on this memory, or lower --micro-batch-size or --seq-len"
            } else {
                "add ranks on other machines or GPUs, or lower --micro-batch-size or --seq-len"
            },
            host_counts,
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offloaded_host_arenas_above_the_hosts_memory_are_refused() {
        // Three ranks of 1000 bytes each: 3000 fit, 2999 do not, unknown memory is no check.
        assert!(refuse_offload_above_host(1000, 3, Some(3000)).is_ok());
        let err = refuse_offload_above_host(1000, 3, Some(2999)).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("3 rank(s)") && text.contains("--offload-optimizer"),
            "{text}"
        );
        assert!(refuse_offload_above_host(u64::MAX, usize::MAX, None).is_ok());
        // The product saturates instead of wrapping below the memory.
        assert!(refuse_offload_above_host(u64::MAX, 2, Some(u64::MAX - 1)).is_err());
    }
}
