//! The host arena of ZeRO-Offload, planned: the optimizer states every unit keeps there and
//! the staging of one piece of the update; with the file tier, the file's layout instead of
//! the states, and two piece-sized slots of states in the staging.

use super::plan::block_bytes;
use super::policy::UnitPolicy;
use crate::error::{Error, Result};
use crate::precision::Precision;

/// Elements of the owned range one offloaded update moves and updates at a time: one
/// gradient bucket's worth (`reduce_bucket_bytes` of the storage type), which bounds the
/// host staging whatever the size of a unit.
pub(crate) fn piece_elems(reduce_bucket_bytes: usize, precision: Precision) -> usize {
    (reduce_bucket_bytes / precision.param_bytes() as usize).max(1)
}

/// The host arena's bytes under ZeRO-Offload, and the file tier's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OffloadPlan {
    /// Every unit's master weights and moments, as the stage keeps them (whole or a shard);
    /// 0 when they live in the file tier.
    pub states: u64,
    /// The staging of one piece of the update, the largest any rank makes (an export gathers
    /// sharded states into heap buffers, not here); with the file tier, two slots of the
    /// largest piece's states besides, held over the whole step (one updated while the
    /// other is written and read).
    pub staging: u64,
    /// Bytes of the rank's optimizer file (`--offload-optimizer nvme`), header included; 0
    /// without the file tier.
    pub file: u64,
}

impl OffloadPlan {
    /// The host arena's capacity.
    pub fn total(&self) -> u64 {
        self.states.saturating_add(self.staging)
    }
}

/// Where each unit's optimizer states sit in the rank's file: every state (m, v, then the
/// master weights for half precision) of each piece of the kept range, pieces in order.
/// Every rank's file has the same layout (a shard's padding is stored, as in the arena).
#[derive(Debug, Clone)]
pub(crate) struct FileLayout {
    /// Each file piece's bytes.
    pub lens: Vec<u64>,
    /// Each unit's first file piece.
    pub first: Vec<usize>,
    /// States per element: 2 (m, v), or 3 with master weights.
    pub states: usize,
    /// Elements per piece ([`piece_elems`]).
    pub piece: usize,
}

impl FileLayout {
    /// The layout for units kept as `policies` say.
    pub fn new(policies: &[UnitPolicy], precision: Precision, piece: usize) -> Self {
        let states = states_per_elem(precision);
        let (mut lens, mut first) = (Vec::new(), Vec::with_capacity(policies.len()));
        for p in policies {
            first.push(lens.len());
            let kept = p.len(p.whole_optim);
            for start in (0..kept).step_by(piece) {
                let len = (piece.min(kept - start) as u64).saturating_mul(4);
                lens.extend(std::iter::repeat_n(len, states));
            }
        }
        Self {
            lens,
            first,
            states,
            piece,
        }
    }

    /// The file piece of `state` (0: m, 1: v, 2: master) of piece `k` of `unit`.
    pub fn index(&self, unit: usize, k: usize, state: usize) -> usize {
        self.first[unit] + k * self.states + state
    }
}

/// f32 optimizer states per element: Adam's m and v, and the master weights where the
/// stored parameters are half precision.
fn states_per_elem(precision: Precision) -> usize {
    if precision.has_master() {
        3
    } else {
        2
    }
}

/// The host arena of ZeRO-Offload for units kept as `policies` say over `world` ranks; with
/// `to_file`, the file tier's layout in place of the states.
///
/// # Errors
/// A block or file whose bytes overflow.
pub(crate) fn plan_offload(
    policies: &[UnitPolicy],
    precision: Precision,
    world: usize,
    reduce_bucket_bytes: usize,
    to_file: bool,
) -> Result<OffloadPlan> {
    let piece = piece_elems(reduce_bucket_bytes, precision);
    let f32_block = |elems: usize| block_bytes((elems as u64).saturating_mul(4));
    let (mut states, mut staging, mut slot_len) = (0u64, 0u64, 1);
    let per_state = states_per_elem(precision) as u64;
    for p in policies {
        let kept = p.len(p.whole_optim);
        let widest = (0..world).map(|r| p.owned(r).len).max().unwrap_or(0);
        staging = staging.max(staging_bytes(precision, widest.min(piece))?);
        states = states.saturating_add(f32_block(kept)?.saturating_mul(per_state));
        slot_len = slot_len.max(kept.min(piece));
    }
    let file = if to_file {
        // The step's two slots of one piece's states, for the whole step, beside the
        // staging of the unit being updated; the states in the file instead of the arena.
        let slot = f32_block(slot_len)?.saturating_mul(per_state);
        staging = staging.saturating_add(slot.saturating_mul(2));
        states = 0;
        let layout = FileLayout::new(policies, precision, piece);
        zero_alloc::tier::file_bytes(&layout.lens)
            .map_err(|e| Error::Order(format!("the optimizer file's size: {e}")))?
    } else {
        0
    };
    Ok(OffloadPlan {
        states,
        staging,
        file,
    })
}

/// Host bytes of one unit's staging (`optimizer_home`'s `Staging`) for an owned range of `len` elements.
fn staging_bytes(precision: Precision, len: usize) -> Result<u64> {
    let len = len.max(1) as u64;
    let stored = block_bytes(len.saturating_mul(precision.param_bytes()))?;
    Ok(2 * stored + block_bytes(len.saturating_mul(4))?)
}
