//! The traffic of one optimizer step before anything runs: the declared schedule replayed
//! against the engine's collective rules, counting elements where [`Engine::traffic`] counts
//! them, so `zero-train plan` can price a configuration that is never run.
//!
//! The rules (the places in the engine that add to its [`Traffic`]):
//! 1. `gather` of a sharded unit (stage 3, above the persistence threshold) that is not
//!    already gathered all-gathers its padded parameters once, directly or as a prefetch
//!    launched earlier (`forward.rs`); nested gathers share it.
//! 2. `end_backward` reduces the unit's padded gradient, bucket by bucket: all-reduce at
//!    stage 0, reduce-scatter at stages 1-3 (`backward.rs`).
//! 3. The optimizer step all-gathers the whole parameters of units updated shard by shard
//!    (stages 1-2, persistent units at stage 3; `step.rs`).
//!
//! Rules 1-2 repeat for every micro-step of the step; rule 3 runs once. A prefetch that
//! is launched and then dropped unused (the engine drops them at the step) would count in the
//! engine and not here; the GPT's schedule launches none (`train_traffic.rs` checks the two
//! agree exactly).
//!
//! [`Engine::traffic`]: crate::Engine::traffic

use super::plan::{unit_policies, PlanShape};
use super::policy::GradReduce;
use super::schedule::{Call, Schedule};
use super::unit::UnitSpec;
use crate::error::{Error, Result};
use zero_comm::{ring_bytes, DType, OpDesc, OpKind};

/// Elements this rank has handed to each kind of collective for model states.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Elements all-reduced.
    pub all_reduce: u64,
    /// Elements reduce-scattered (whole arrays).
    pub reduce_scatter: u64,
    /// Elements all-gathered (whole arrays).
    pub all_gather: u64,
}

impl Traffic {
    /// Paper accounting: an all-reduce moves 2x its array, the others 1x.
    pub fn elements(&self) -> u64 {
        2 * self.all_reduce + self.reduce_scatter + self.all_gather
    }
}

/// Elements one rank hands to each kind of collective over one optimizer step of
/// `micro_steps` micro-steps, each making `schedule`'s calls on `specs` (the engine's
/// [`Traffic`] per step, before running it).
///
/// # Errors
/// A malformed schedule, a partition error (zero ranks), or counts that overflow.
pub fn plan_traffic(
    specs: &[UnitSpec],
    schedule: &Schedule,
    shape: PlanShape,
    micro_steps: u64,
) -> Result<Traffic> {
    schedule.check(specs.len()).map_err(Error::BadProgram)?;
    let policies = unit_policies(specs, shape)?;
    let overflow = || Error::Order("the traffic of a step overflows".into());
    let mut micro = Traffic::default();
    let mut refs = vec![0usize; specs.len()];
    for &call in schedule.calls() {
        match call {
            Call::Gather(u) => {
                let p = policies[u];
                if refs[u] == 0 && p.gathered() {
                    micro.all_gather += p.part.padded_numel() as u64;
                }
                refs[u] += 1;
            }
            Call::Release(u) => refs[u] = refs[u].saturating_sub(1),
            Call::EndBackward(u) => {
                let padded = policies[u].part.padded_numel() as u64;
                match policies[u].reduce {
                    GradReduce::AllReduce => micro.all_reduce += padded,
                    GradReduce::ReduceScatter => micro.reduce_scatter += padded,
                }
            }
            // Opening a gradient and kept inputs move nothing between ranks.
            _ => {}
        }
    }
    let times = |n: u64| n.checked_mul(micro_steps).ok_or_else(overflow);
    let after_step: u64 = policies
        .iter()
        .filter(|p| p.syncs_params_after_step())
        .map(|p| p.len(p.whole_params) as u64)
        .sum();
    Ok(Traffic {
        all_reduce: times(micro.all_reduce)?,
        reduce_scatter: times(micro.reduce_scatter)?,
        all_gather: times(micro.all_gather)?
            .checked_add(after_step)
            .ok_or_else(overflow)?,
    })
}

impl Traffic {
    /// Bytes one rank of `world` sends and receives for this traffic in elements of `dtype`,
    /// as zero-comm counts them for each collective ([`ring_bytes`]: (N-1)/N of the array
    /// each way for reduce-scatter and all-gather, twice that for all-reduce): what crosses
    /// the rank's link.
    pub fn ring_bytes(&self, world: usize, dtype: DType) -> (u64, u64) {
        // zero-comm multiplies an op's bytes by N - 1 unchecked; counts that could overflow
        // that (past 10^15 elements at 1024 ranks) are beyond any model the trainer accepts.
        let op = |kind, count: u64| OpDesc {
            seq: 0,
            kind,
            dtype: Some(dtype),
            count: usize::try_from(count).unwrap_or(usize::MAX / dtype.size()),
            root: None,
            op: None,
        };
        [
            op(OpKind::AllReduce, self.all_reduce),
            op(OpKind::ReduceScatter, self.reduce_scatter),
            op(OpKind::AllGather, self.all_gather),
        ]
        .iter()
        .map(|d| ring_bytes(d, 0, world))
        .fold((0, 0), |(s, r), (ds, dr)| {
            (s.saturating_add(ds), r.saturating_add(dr))
        })
    }
}
