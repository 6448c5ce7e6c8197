//! The host tier of ZeRO-Offload and ZeRO-Infinity, planned: the optimizer states every unit
//! keeps in the host arena and the staging of one piece of the update; with the file tier,
//! the file's layout instead of the states, and two piece-sized slots of states in the
//! staging; with the parameters offloaded, the gathered units' stored shards in a host arena
//! of their own or in a file of their own.

use super::plan::{block_bytes, optimizer_host_block_bytes, read_ahead_block_bytes, PlanShape};
use super::policy::UnitPolicy;
use crate::error::{Error, Result};
use crate::precision::Precision;
use zero_comm::ShardBuckets;

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
    /// Every unit's reduced gradients (storage type, whole or a shard as the stage keeps
    /// them) with `offload_gradients`; 0 otherwise.
    pub grads: u64,
    /// The gradients have a host arena of their own ([`OffloadPlan::grads_arena`]): beside
    /// the delayed update, whose thread holds the optimizer's host arena while the next
    /// backward lands gradients.
    pub grads_apart: bool,
    /// With `offload_gradients` on a device's arena (`PlanShape::device_arena`): the host
    /// block one landed bucket's segment is copied into before it is added (`grad_home`'s
    /// step 2), the largest any unit lands, beside the gradients during backward (never
    /// beside the update's staging); 0 otherwise.
    pub landing: u64,
    /// The staging of one piece of the update, the largest any rank makes (an export gathers
    /// sharded states into heap buffers, not here); with the file tier, two slots of the
    /// largest piece's states besides, held over the whole step (one updated while the
    /// other is written and read).
    pub staging: u64,
    /// Bytes of the rank's optimizer file (`--offload-optimizer nvme`), header included; 0
    /// without the file tier.
    pub file: u64,
    /// The stored parameter shards of the units stage 3 gathers, in the host arena of the
    /// offloaded parameters (`--offload-params cpu`); 0 otherwise.
    pub params: u64,
    /// Bytes of the rank's parameter file (`--offload-params nvme`), header included; 0
    /// otherwise.
    pub params_file: u64,
    /// The host arena of the parameter file's reads ahead (`param_read_ahead`): the
    /// look-ahead budget, or the largest shard when a shard is larger, or every shard when
    /// they all take less; 0 without the parameter file.
    pub params_read_ahead: u64,
    /// The delayed parameter update's host blocks: each unit's owned gradients and
    /// parameters (storage type), the widest any rank owns; 0 without it.
    pub delayed: u64,
}

impl OffloadPlan {
    /// The optimizer's host arena: its states (unless in the file), the offloaded gradients
    /// (unless apart), and the update's staging or the landing block, whichever is larger
    /// (one is held during the step, the other during backward).
    pub fn optimizer_arena(&self) -> u64 {
        let grads = if self.grads_apart { 0 } else { self.grads };
        self.states
            .saturating_add(grads)
            .saturating_add(self.transient())
            .saturating_add(self.delayed)
    }

    /// The optimizer's host arena's room for blocks held in turn: the update's staging (the
    /// step) or, beside the gradients, the landing block (backward), whichever is larger.
    pub fn transient(&self) -> u64 {
        match self.grads_apart {
            true => self.staging,
            false => self.staging.max(self.landing),
        }
    }

    /// The gradients' own host arena: their bytes and the landing block when apart, else 0.
    pub fn grads_arena(&self) -> u64 {
        match self.grads_apart {
            true => self.grads.saturating_add(self.landing),
            false => 0,
        }
    }

    /// Every byte of host memory the offloaded tiers take: the optimizer's host arena, the
    /// gradients' own, the offloaded parameters' and their reads ahead (what
    /// `--host-memory-limit` caps).
    pub fn total(&self) -> u64 {
        self.optimizer_arena()
            .saturating_add(self.grads_arena())
            .saturating_add(self.params)
            .saturating_add(self.params_read_ahead)
    }

    /// Bytes of the rank's files: the optimizer's and the parameters'.
    pub fn files(&self) -> u64 {
        self.file.saturating_add(self.params_file)
    }
}

/// Where the stored parameter shards of the offloaded units sit in the rank's parameter
/// file: each unit's shard in pieces of [`piece_elems`] elements of the storage type, pieces
/// in order; units whose parameters stay in the arena have none.
#[derive(Debug, Clone)]
pub(crate) struct ParamFileLayout {
    /// Each file piece's bytes.
    pub lens: Vec<u64>,
    /// Each unit's first file piece.
    pub first: Vec<usize>,
    /// Bytes per full piece.
    pub piece_bytes: usize,
}

impl ParamFileLayout {
    /// The layout of the shards of the units `policies` gather (stage 3), `elem` bytes per
    /// element, `piece` elements per piece.
    pub fn new(policies: &[UnitPolicy], elem: usize, piece: usize) -> Self {
        let (mut lens, mut first) = (Vec::new(), Vec::with_capacity(policies.len()));
        for p in policies {
            first.push(lens.len());
            if !p.gathered() {
                continue;
            }
            let shard = p.len(false);
            for start in (0..shard).step_by(piece) {
                lens.push((piece.min(shard - start) as u64).saturating_mul(elem as u64));
            }
        }
        Self {
            lens,
            first,
            piece_bytes: piece.saturating_mul(elem),
        }
    }

    /// Pieces of `unit`: the file pieces from `first[unit]`, how many.
    pub fn pieces(&self, unit: usize) -> std::ops::Range<usize> {
        let start = self.first.get(unit).copied().unwrap_or(self.lens.len());
        let end = self.first.get(unit + 1).copied().unwrap_or(self.lens.len());
        start..end
    }
}

/// Host and file bytes of the gathered units' stored shards with `--offload-params`: in the
/// host arena (`to_file` false) or the rank's parameter file.
///
/// # Errors
/// A block or file whose bytes overflow.
pub(crate) fn plan_param_offload(
    policies: &[UnitPolicy],
    precision: Precision,
    reduce_bucket_bytes: usize,
    to_file: bool,
) -> Result<(u64, u64)> {
    let elem = precision.param_bytes();
    if to_file {
        let piece = piece_elems(reduce_bucket_bytes, precision);
        let layout = ParamFileLayout::new(policies, elem as usize, piece);
        let bytes = zero_alloc::tier::file_bytes(&layout.lens)
            .map_err(|e| Error::Order(format!("the parameter file's size: {e}")))?;
        return Ok((0, bytes));
    }
    let mut host = 0u64;
    for p in policies.iter().filter(|p| p.gathered()) {
        let shard = block_bytes((p.len(false) as u64).saturating_mul(elem))?;
        host = host.saturating_add(shard);
    }
    Ok((host, 0))
}

/// Host bytes of the parameter file's reads ahead: blocks of the gathered units' shards
/// holding at most `budget` bytes, or the largest shard alone when it is larger; never more
/// than every shard at once.
///
/// # Errors
/// A block whose bytes overflow.
pub(crate) fn plan_read_ahead(
    policies: &[UnitPolicy],
    precision: Precision,
    budget: usize,
) -> Result<u64> {
    let elem = precision.param_bytes();
    let (mut largest, mut every) = (0u64, 0u64);
    for p in policies.iter().filter(|p| p.gathered()) {
        let shard = read_ahead_block_bytes((p.len(false) as u64).saturating_mul(elem))?;
        largest = largest.max(shard);
        every = every.saturating_add(shard);
    }
    if every == 0 {
        return Ok(0);
    }
    read_ahead_block_bytes(largest.max(every.min(budget as u64)))
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

/// Host bytes of the file tier's two slots (`optimizer_stream`), each one f32 block per
/// state of the largest piece of any unit's kept range.
///
/// # Errors
/// A block whose bytes overflow.
pub(crate) fn file_slots_bytes(
    policies: &[UnitPolicy],
    precision: Precision,
    piece: usize,
) -> Result<u64> {
    let slot_len = policies
        .iter()
        .map(|p| p.len(p.whole_optim).min(piece))
        .fold(1, usize::max);
    let slot = optimizer_host_block_bytes((slot_len as u64).saturating_mul(4), true)?;
    Ok(slot
        .saturating_mul(states_per_elem(precision) as u64)
        .saturating_mul(2))
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

/// The host arena of ZeRO-Offload for units kept as `policies` say on a rank shaped as
/// `shape`: with `optimizer_file`, the file tier's layout in place of the states; with
/// `offload_gradients`, the kept gradients beside them.
///
/// # Errors
/// A block or file whose bytes overflow.
pub(crate) fn plan_offload(policies: &[UnitPolicy], shape: PlanShape) -> Result<OffloadPlan> {
    let precision = shape.precision;
    let piece = piece_elems(shape.reduce_bucket_bytes, precision);
    let files = shape.files();
    let host_block = |bytes: u64| optimizer_host_block_bytes(bytes, files);
    let f32_block = |elems: usize| host_block((elems as u64).saturating_mul(4));
    let (mut states, mut grads, mut staging, mut landing) = (0u64, 0u64, 0u64, 0u64);
    let per_state = states_per_elem(precision) as u64;
    let grad_bytes = precision.grad_bytes();
    for p in policies {
        let kept = p.len(p.whole_optim);
        let widest = (0..shape.world).map(|r| p.owned(r).len).max().unwrap_or(0);
        let piece_staging = staging_bytes(
            precision,
            widest.min(piece),
            (shape.offload_gradients, files),
        );
        staging = staging.max(piece_staging?);
        states = states.saturating_add(f32_block(kept)?.saturating_mul(per_state));
        if shape.offload_gradients {
            let len = p.len(p.whole_grads) as u64;
            grads = grads.saturating_add(host_block(len.saturating_mul(grad_bytes))?);
        }
        if shape.offload_gradients && shape.device_arena {
            let bucket = shape.reduce_bucket_bytes / grad_bytes as usize;
            let buckets = ShardBuckets::new(p.part.world(), p.part.shard_len(), bucket)?;
            let segment = buckets.max_piece_elems() as u64;
            if segment > 0 {
                landing = landing.max(host_block(segment.saturating_mul(grad_bytes))?);
            }
        }
    }
    let file = if shape.optimizer_file {
        // The step's two slots, for the whole step, beside the staging of the unit being
        // updated; the states in the file instead of the arena.
        staging = staging.saturating_add(file_slots_bytes(policies, precision, piece)?);
        states = 0;
        let layout = FileLayout::new(policies, precision, piece);
        zero_alloc::tier::file_bytes(&layout.lens)
            .map_err(|e| Error::Order(format!("the optimizer file's size: {e}")))?
    } else {
        0
    };
    Ok(OffloadPlan {
        states,
        grads,
        grads_apart: shape.offload_gradients && shape.delayed_param_update,
        landing,
        staging,
        file,
        params: 0,
        params_file: 0,
        params_read_ahead: 0,
        delayed: 0,
    })
}

/// Host bytes of the delayed parameter update on a rank shaped as `shape`: per unit, its
/// blocks of owned gradients and parameters in the storage type, the widest range any rank
/// owns; and, in place of the offloaded update's staging, the thread's one f32 scratch block
/// of a piece (the caller adds the file's slots with the file tier).
///
/// # Errors
/// A block whose bytes overflow.
pub(crate) fn plan_delayed(policies: &[UnitPolicy], shape: PlanShape) -> Result<(u64, u64)> {
    let (precision, world) = (shape.precision, shape.world);
    let reduce_bucket_bytes = shape.reduce_bucket_bytes;
    let host_block = |bytes: u64| optimizer_host_block_bytes(bytes, shape.files());
    let piece = piece_elems(reduce_bucket_bytes, precision);
    let (mut blocks, mut scratch) = (0u64, 0u64);
    for p in policies {
        let widest = (0..world).map(|r| p.owned(r).len).max().unwrap_or(0).max(1);
        let block = host_block((widest as u64).saturating_mul(precision.param_bytes()))?;
        blocks = blocks.saturating_add(block.saturating_mul(2));
        scratch = scratch.max(host_block((widest.min(piece) as u64).saturating_mul(4))?);
    }
    Ok((blocks, scratch))
}

/// Host bytes of one unit's staging (`optimizer_home`'s `Staging`) for an owned range of
/// `len` elements: the parameters and, unless `grads_on_host` (the update reads them where
/// they are), the gradients in the storage type, and the update's f32 gradient.
fn staging_bytes(
    precision: Precision,
    len: usize,
    (grads_on_host, files): (bool, bool),
) -> Result<u64> {
    let len = len.max(1) as u64;
    let stored = optimizer_host_block_bytes(len.saturating_mul(precision.param_bytes()), files)?;
    let copies = if grads_on_host { 1 } else { 2 };
    Ok(copies * stored + optimizer_host_block_bytes(len.saturating_mul(4), files)?)
}
