//! One unit's arena blocks on a rank, and how whole values are stored into them.

use super::error::Result;
use super::policy::UnitPolicy;
use super::precision::{narrow, with_store, Precision};
use zero_alloc::{Arena, Handle};

/// One unit's arena blocks on this rank.
#[derive(Debug)]
pub(crate) struct UnitBuffers {
    /// Parameters in the storage type: the padded unit, or this rank's shard.
    pub params: Handle,
    /// f32 master weights (half precision only): padded unit or shard, like `m` and `v`.
    pub master: Option<Handle>,
    /// Reduced gradients in the storage type, accumulated over micro-steps: padded unit or
    /// shard.
    pub grads: Handle,
    /// Adam moments (f32): padded unit or shard.
    pub m: Handle,
    pub v: Handle,
    /// The f32 compute copy of the whole unit while gathered, and how many users hold it.
    pub gathered: Option<Handle>,
    pub gather_refs: usize,
    /// During the unit's backward: its unreduced f32 gradient.
    pub unreduced: Option<Handle>,
}

impl UnitBuffers {
    /// Zeroed blocks for a unit, each whole or a shard as `policy` keeps it.
    pub fn new(arena: &mut Arena, policy: &UnitPolicy, precision: Precision) -> Result<Self> {
        let optim_len = policy.len(policy.whole_optim);
        Ok(with_store!(precision, S => UnitBuffers {
            params: zeroed::<S>(arena, policy.len(policy.whole_params))?,
            master: if precision.has_master() {
                Some(zeroed::<f32>(arena, optim_len)?)
            } else {
                None
            },
            grads: zeroed::<S>(arena, policy.len(policy.whole_grads))?,
            m: zeroed::<f32>(arena, optim_len)?,
            v: zeroed::<f32>(arena, optim_len)?,
            gathered: None,
            gather_refs: 0,
            unreduced: None,
        }))
    }
}

/// A zero-filled block of `len` elements (arena blocks hold stale bytes after reuse).
pub(crate) fn zeroed<T: bytemuck::Pod>(arena: &mut Arena, len: usize) -> Result<Handle> {
    let h = arena.alloc_elems::<T>(len)?;
    arena.slice_mut::<T>(h)?.fill(T::zeroed());
    Ok(h)
}

/// A transient f32 block holding a unit's whole (padded) initial values.
pub(crate) fn initial_values(
    arena: &mut Arena,
    policy: &UnitPolicy,
    init: impl FnOnce(&mut [f32]),
) -> Result<Handle> {
    let full = zeroed::<f32>(arena, policy.part.padded_numel())?;
    init(&mut arena.slice_mut::<f32>(full)?[..policy.part.numel()]);
    Ok(full)
}

/// Stores whole f32 `values` (padded) into a unit's buffers as its stage keeps them: the
/// stored parameters (rounded for half precision) and the f32 master copy.
pub(crate) fn write_whole(
    arena: &mut Arena,
    policy: &UnitPolicy,
    b: &UnitBuffers,
    precision: Precision,
    rank: usize,
    values: Handle,
) -> Result<()> {
    let shard = policy.part.shard(rank);
    let mut views = arena.views();
    let values = views.get::<f32>(values)?;
    let part = |whole: bool| {
        if whole {
            values
        } else {
            &values[shard.range()]
        }
    };
    with_store!(precision, S => {
        let stored = views.get_mut::<S>(b.params)?;
        narrow(part(policy.whole_params), stored, 1.0);
    });
    if let Some(master) = b.master {
        views
            .get_mut::<f32>(master)?
            .copy_from_slice(part(policy.whole_optim));
    }
    Ok(())
}
