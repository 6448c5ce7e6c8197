//! The host arena of ZeRO-Offload, planned: the optimizer states every unit keeps there and
//! the staging of one piece of the update.

use super::plan::block_bytes;
use super::policy::UnitPolicy;
use crate::error::Result;
use crate::precision::Precision;

/// Elements of the owned range one offloaded update moves and updates at a time: one
/// gradient bucket's worth (`reduce_bucket_bytes` of the storage type), which bounds the
/// host staging whatever the size of a unit.
pub(crate) fn piece_elems(reduce_bucket_bytes: usize, precision: Precision) -> usize {
    (reduce_bucket_bytes / precision.param_bytes() as usize).max(1)
}

/// The host arena's bytes under ZeRO-Offload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OffloadPlan {
    /// Every unit's master weights and moments, as the stage keeps them (whole or a shard).
    pub states: u64,
    /// The staging of one piece of the update, the largest any rank makes (an export gathers
    /// sharded states into heap buffers, not here).
    pub staging: u64,
}

impl OffloadPlan {
    /// The host arena's capacity.
    pub fn total(&self) -> u64 {
        self.states + self.staging
    }
}

/// The host arena of ZeRO-Offload for units kept as `policies` say over `world` ranks.
///
/// # Errors
/// A block whose bytes overflow.
pub(crate) fn plan_offload(
    policies: &[UnitPolicy],
    precision: Precision,
    world: usize,
    reduce_bucket_bytes: usize,
) -> Result<OffloadPlan> {
    let piece = piece_elems(reduce_bucket_bytes, precision);
    let f32_block = |elems: usize| block_bytes((elems as u64).saturating_mul(4));
    let (mut states, mut staging) = (0u64, 0u64);
    let per_state = if precision.has_master() { 3 } else { 2 };
    for p in policies {
        let kept = f32_block(p.len(p.whole_optim))?;
        states = states.saturating_add(kept.saturating_mul(per_state));
        let widest = (0..world).map(|r| p.owned(r).len).max().unwrap_or(0);
        staging = staging.max(staging_bytes(precision, widest.min(piece))?);
    }
    Ok(OffloadPlan { states, staging })
}

/// Host bytes of one unit's staging (`optimizer_home`'s `Staging`) for an owned range of `len` elements.
fn staging_bytes(precision: Precision, len: usize) -> Result<u64> {
    let len = len.max(1) as u64;
    let stored = block_bytes(len.saturating_mul(precision.param_bytes()))?;
    Ok(2 * stored + block_bytes(len.saturating_mul(4))?)
}
