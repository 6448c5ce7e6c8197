//! One unit's arena blocks on a rank, and how whole values are stored into them.

use super::error::{Error, Result};
use super::kernels::{Kernels, Span};
use super::planning::policy::UnitPolicy;
use super::precision::Precision;
use super::transient::free_on_error;
use zero_alloc::{Arena, Backing, Handle};
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
    /// Zeroed blocks for a unit, each whole or a shard as `policy` keeps it: the stored
    /// parameters and gradients in `arena`, the optimizer states in `optim` when given (the
    /// offloaded host arena and its kernels), else in `arena` too; a gathered unit's
    /// parameter shard in `params_home` when given (the offloaded parameters' arena, whose
    /// blocks the caller fills); the gradients in `grads` when given (a zeroed block of the
    /// host arena, `grad_home`).
    pub fn new(
        arena: &mut Arena,
        kernels: &dyn Kernels,
        (optim, params_home): (Option<(&mut Arena, &dyn Kernels)>, Option<&mut Arena>),
        grads: Option<Handle>,
        policy: &UnitPolicy,
        precision: Precision,
    ) -> Result<Self> {
        let optim_len = policy.len(policy.whole_optim);
        let store = precision.dtype();
        let params_len = policy.len(policy.whole_params);
        let params = match params_home.filter(|_| policy.gathered()) {
            Some(home) => alloc_of(home, store, params_len)?,
            None => zeroed(arena, kernels, store, params_len)?,
        };
        let grads = match grads {
            Some(h) => h,
            None => zeroed(arena, kernels, store, policy.len(policy.whole_grads))?,
        };
        let (oa, ok) = optim.unwrap_or((arena, kernels));
        let mut zeroed32 = || zeroed(oa, ok, DType::F32, optim_len);
        Ok(UnitBuffers {
            params,
            master: if precision.has_master() {
                Some(zeroed32()?)
            } else {
                None
            },
            grads,
            m: zeroed32()?,
            v: zeroed32()?,
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
    let h = alloc_of(arena, dtype, len)?;
    // An accounting arena (the file tier's mirror of its states) has no bytes to zero:
    // the file it mirrors is created zeroed.
    if arena.config().backing != Backing::Accounting {
        kernels.fill_zero(arena, dtype, Span::new(h, 0..len))?;
    }
    Ok(h)
}

/// A block of `len` elements of `dtype`, its bytes as the arena left them.
pub(crate) fn alloc_of(arena: &mut Arena, dtype: DType, len: usize) -> Result<Handle> {
    Ok(match dtype {
        DType::F32 => arena.alloc_elems::<f32>(len)?,
        DType::Bf16 | DType::F16 => arena.alloc_elems::<u16>(len)?,
        DType::I32 => arena.alloc_elems::<i32>(len)?,
        DType::I64 => arena.alloc_elems::<i64>(len)?,
        DType::F64 => arena.alloc_elems::<f64>(len)?,
    })
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
    let written = arena.write_bytes(full, bytemuck::cast_slice(values));
    free_on_error(arena, full, written.map_err(Error::from))?;
    Ok(full)
}

/// Stores whole f32 `values` (padded, in block `values`) into the unit's stored parameters as
/// its stage keeps them, rounded for half precision. The master copy is written from
/// [`kept_values`] wherever the optimizer states live (`start.rs`).
pub(crate) fn write_params(
    arena: &mut Arena,
    kernels: &dyn Kernels,
    policy: &UnitPolicy,
    b: &UnitBuffers,
    precision: Precision,
    rank: usize,
    values: Handle,
) -> Result<()> {
    let part = if policy.whole_params {
        0..policy.part.padded_numel()
    } else {
        policy.part.shard(rank).range()
    };
    let stored = Span::new(b.params, 0..policy.len(policy.whole_params));
    kernels.narrow(
        arena,
        precision.dtype(),
        Span::new(values, part),
        stored,
        1.0,
    )
}

/// The part of a unit's whole f32 `values` (its `numel` real elements) that a buffer kept
/// whole or as `rank`'s shard holds, zeros in its padding.
pub(crate) fn kept_values(
    policy: &UnitPolicy,
    rank: usize,
    whole: bool,
    values: &[f32],
) -> Vec<f32> {
    let mut local = vec![0f32; policy.len(whole)];
    let real = if whole {
        0..values.len()
    } else {
        policy.part.data_shard(rank).range()
    };
    let n = real.len();
    local[..n].copy_from_slice(&values[real]);
    local
}
