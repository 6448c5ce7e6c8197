//! The element types model states are stored in, and the one place that dispatches on them.
//!
//! Parameters and gradients are stored as f32, bf16 or f16 ([`Precision`]); the model
//! computes in f32 on transient copies, and the optimizer keeps f32 master weights and
//! moments for the half types. Code that touches stored values is generic over [`Store`]
//! and reached through [`with_store!`], so each precision is written once.

use bytemuck::Pod;
use zero_comm::F32Element;

/// How parameters and gradients are stored, and so what the optimizer keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Precision {
    /// fp32 parameters and gradients; Adam keeps m and v (the parameters are the master copy).
    Fp32,
    /// bf16 parameters and gradients; fp32 master weights, m and v.
    Bf16,
    /// fp16 parameters and gradients (with loss scaling); fp32 master weights, m and v.
    Fp16,
}

/// A storage element type: reducible by zero-comm in f32 and viewable from the arena.
pub(crate) trait Store: F32Element + Pod {}

impl<T: F32Element + Pod> Store for T {}

/// Runs `$body` with the type alias `$S` bound to `$precision`'s storage type.
macro_rules! with_store {
    ($precision:expr, $S:ident => $body:expr) => {
        match $precision {
            $crate::Precision::Fp32 => {
                type $S = f32;
                $body
            }
            $crate::Precision::Bf16 => {
                type $S = half::bf16;
                $body
            }
            $crate::Precision::Fp16 => {
                type $S = half::f16;
                $body
            }
        }
    };
}
pub(crate) use with_store;

/// Runs `$body` with the type alias `$S` bound to the Rust type of a `zero_comm::DType`;
/// returns [`Error::NotStored`](crate::Error::NotStored) from the enclosing function for a
/// type no precision stores.
macro_rules! with_dtype {
    ($dtype:expr, $S:ident => $body:expr) => {
        match $dtype {
            zero_comm::DType::F32 => {
                type $S = f32;
                $body
            }
            zero_comm::DType::Bf16 => {
                type $S = half::bf16;
                $body
            }
            zero_comm::DType::F16 => {
                type $S = half::f16;
                $body
            }
            dtype @ (zero_comm::DType::I32 | zero_comm::DType::I64 | zero_comm::DType::F64) => {
                return Err($crate::Error::NotStored { dtype })
            }
        }
    };
}
pub(crate) use with_dtype;

/// `dst = f32(src) * factor`, element by element.
pub(crate) fn widen<S: Store>(src: &[S], dst: &mut [f32], factor: f32) {
    S::load_block(src, dst);
    if factor != 1.0 {
        for x in dst.iter_mut() {
            *x *= factor;
        }
    }
}

/// `dst = round(src * factor)`, element by element.
pub(crate) fn narrow<S: Store>(src: &[f32], dst: &mut [S], factor: f32) {
    if factor == 1.0 {
        S::store_block(src, dst);
    } else {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = S::from_f32(s * factor);
        }
    }
}

/// `acc = round(f32(acc) + f32(x))`: the one accumulation every stage shares. Returns whether
/// any stored sum is inf or NaN: an inf or NaN `x`, or two finite values whose sum rounds
/// past the storage type's range (fp16's 65504, reached by accumulated micro-steps whose
/// gradients each fit). Found in the same pass without an early exit, so the check
/// vectorises with the sum.
pub(crate) fn accumulate<S: Store>(acc: &mut [S], x: &[S]) -> bool {
    let mut non_finite = false;
    for (a, &g) in acc.iter_mut().zip(x) {
        *a = S::from_f32(a.to_f32() + g.to_f32());
        non_finite |= !a.to_f32().is_finite();
    }
    non_finite
}

impl Precision {
    /// Bytes per stored parameter element.
    pub fn param_bytes(self) -> u64 {
        match self {
            Self::Fp32 => 4,
            Self::Bf16 | Self::Fp16 => 2,
        }
    }

    /// Bytes per stored gradient element.
    pub fn grad_bytes(self) -> u64 {
        self.param_bytes()
    }

    /// K: optimizer-state bytes per parameter for Adam.
    pub fn optimizer_bytes(self) -> u64 {
        match self {
            Self::Fp32 => 8,
            Self::Bf16 | Self::Fp16 => 12,
        }
    }

    /// The storage element type.
    pub fn dtype(self) -> zero_comm::DType {
        match self {
            Self::Fp32 => zero_comm::DType::F32,
            Self::Bf16 => zero_comm::DType::Bf16,
            Self::Fp16 => zero_comm::DType::F16,
        }
    }

    /// True when the optimizer keeps a separate f32 master copy.
    pub(crate) fn has_master(self) -> bool {
        self != Precision::Fp32
    }
}
