//! One unit's arena blocks on a rank, and how whole values are stored into them.

use super::error::Result;
use super::kernels::{Kernels, Span};
use super::policy::UnitPolicy;
use super::precision::Precision;
use zero_alloc::{Arena, Handle};
use zero_comm::DType;

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
    pub fn new(
        arena: &mut Arena,
        kernels: &dyn Kernels,
        policy: &UnitPolicy,
        precision: Precision,
    ) -> Result<Self> {
        let optim_len = policy.len(policy.whole_optim);
        let store = precision.dtype();
        let mut zeroed = |dtype, len| zeroed(arena, kernels, dtype, len);
        Ok(UnitBuffers {
            params: zeroed(store, policy.len(policy.whole_params))?,
            master: if precision.has_master() {
                Some(zeroed(DType::F32, optim_len)?)
            } else {
                None
            },
            grads: zeroed(store, policy.len(policy.whole_grads))?,
            m: zeroed(DType::F32, optim_len)?,
            v: zeroed(DType::F32, optim_len)?,
            gathered: None,
            gather_refs: 0,
            unreduced: None,
        })
    }
}

/// A zero-filled block of `len` elements of `dtype` (arena blocks hold stale bytes after
/// reuse).
pub(crate) fn zeroed(
    arena: &mut Arena,
    kernels: &dyn Kernels,
    dtype: DType,
    len: usize,
) -> Result<Handle> {
    let h = match dtype {
        DType::F32 => arena.alloc_elems::<f32>(len)?,
        DType::Bf16 | DType::F16 => arena.alloc_elems::<u16>(len)?,
    };
    kernels.fill_zero(arena, dtype, Span::new(h, 0..len))?;
    Ok(h)
}

/// A transient f32 block holding `values` then zeros up to the unit's padded length:
/// written from the host, so it works on any arena with memory.
pub(crate) fn upload_whole(
    arena: &mut Arena,
    kernels: &dyn Kernels,
    policy: &UnitPolicy,
    values: &[f32],
) -> Result<Handle> {
    let full = zeroed(arena, kernels, DType::F32, policy.part.padded_numel())?;
    if let Err(e) = arena.write_bytes(full, bytemuck::cast_slice(values)) {
        arena.free(full)?;
        return Err(e.into());
    }
    Ok(full)
}

/// Stores whole f32 `values` (padded) into a unit's buffers as its stage keeps them: the
/// stored parameters (rounded for half precision) and the f32 master copy.
pub(crate) fn write_whole(
    arena: &mut Arena,
    kernels: &dyn Kernels,
    policy: &UnitPolicy,
    b: &UnitBuffers,
    precision: Precision,
    rank: usize,
    values: Handle,
) -> Result<()> {
    let shard = policy.part.shard(rank);
    let part = |whole: bool| {
        if whole {
            Span::new(values, 0..policy.part.padded_numel())
        } else {
            Span::new(values, shard.range())
        }
    };
    let stored = Span::new(b.params, 0..policy.len(policy.whole_params));
    kernels.narrow(
        arena,
        precision.dtype(),
        part(policy.whole_params),
        stored,
        1.0,
    )?;
    if let Some(master) = b.master {
        let master = Span::new(master, 0..policy.len(policy.whole_optim));
        kernels.copy(arena, DType::F32, part(policy.whole_optim), master)?;
    }
    Ok(())
}
