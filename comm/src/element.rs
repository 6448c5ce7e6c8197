//! The typed side of [`DType`]: the [`Element`] trait that every collective is generic over,
//! the accumulators reductions run in, and [`F32Element`], the types reduced in f32.
//!
//! Arithmetic of a reduction, per type (every backend on the CPU runs it through
//! `reduce_op::reduce_raw`; NCCL's own kernels do the same operations):
//! - f32, bf16, f16: widen exactly to f32, combine in f32, round once to the type;
//! - f64: combine in f64;
//! - i32, i64: combine in the type itself; a sum wraps around at the type's limits (two's
//!   complement, as NCCL and MPI's integer sums do), and avg is refused
//!   ([`ReduceOp::supports`]): an integer mean would need a rounding rule of its own.

use bytemuck::Pod;
use half::{bf16, f16};

use crate::dtype::{BufMut, BufRef, DType};
use crate::reduce_op::ReduceOp;

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::bf16 {}
    impl Sealed for half::f16 {}
    impl Sealed for i32 {}
    impl Sealed for i64 {}
    impl Sealed for f64 {}
}

/// The type a reduction accumulates in (`f32`, `f64`, `i32` or `i64`) and its operations.
pub trait Accumulator: sealed::Sealed + Copy + Default + Send + Sync + 'static {
    /// `self + x`: IEEE addition for floats, wrapping addition for integers.
    fn add(self, x: Self) -> Self;
    /// The larger of the two (floats: `f32::max` semantics, a NaN loses to a number).
    fn max(self, x: Self) -> Self;
    /// The smaller of the two (floats: `f32::min` semantics).
    fn min(self, x: Self) -> Self;
    /// `self / n` for avg: an IEEE division for floats (so avg rounds as sum / n would). For
    /// integers the truncated quotient, which no collective reaches: they refuse avg on
    /// integers before running ([`ReduceOp::supports`]).
    fn div_count(self, n: usize) -> Self;
}

macro_rules! float_accumulator {
    ($t:ty) => {
        impl Accumulator for $t {
            #[inline(always)]
            fn add(self, x: Self) -> Self {
                self + x
            }
            #[inline(always)]
            fn max(self, x: Self) -> Self {
                <$t>::max(self, x)
            }
            #[inline(always)]
            fn min(self, x: Self) -> Self {
                <$t>::min(self, x)
            }
            #[inline(always)]
            fn div_count(self, n: usize) -> Self {
                self / n as $t
            }
        }
    };
}

macro_rules! int_accumulator {
    ($t:ty) => {
        impl Accumulator for $t {
            #[inline(always)]
            fn add(self, x: Self) -> Self {
                self.wrapping_add(x)
            }
            #[inline(always)]
            fn max(self, x: Self) -> Self {
                Ord::max(self, x)
            }
            #[inline(always)]
            fn min(self, x: Self) -> Self {
                Ord::min(self, x)
            }
            #[inline(always)]
            fn div_count(self, n: usize) -> Self {
                self.wrapping_div(<$t>::try_from(n).unwrap_or(<$t>::MAX))
            }
        }
    };
}

float_accumulator!(f32);
float_accumulator!(f64);
int_accumulator!(i32);
int_accumulator!(i64);

/// A type a collective can move and reduce: `f32`, `bf16`, `f16`, `i32`, `i64`, `f64`.
///
/// The methods below are the reduction kernel's per-type steps; callers of collectives only
/// name the trait as a bound (`comm.all_reduce::<i64>(..)`).
pub trait Element:
    sealed::Sealed + Pod + PartialEq + std::fmt::Debug + Default + Send + Sync
{
    /// The tag of this type.
    const DTYPE: DType;
    /// What a reduction accumulates in (see the module docs).
    type Acc: Accumulator;
    /// Widens `src` into `dst` (same length); exact for every type.
    fn widen_block(src: &[Self], dst: &mut [Self::Acc]);
    /// Rounds `src` into `dst` (same length; the identity unless `Acc` is wider).
    fn narrow_block(src: &[Self::Acc], dst: &mut [Self]);
    /// `acc = op(widen(a), widen(b))` element-wise (the first two inputs, fused).
    #[inline]
    fn accumulate2(
        acc: &mut [Self::Acc],
        a: &[Self],
        b: &[Self],
        tmp: &mut [Self::Acc],
        op: ReduceOp,
    ) {
        Self::widen_block(a, acc);
        Self::accumulate(acc, b, tmp, op);
    }
    /// `acc = op(acc, widen(src))` element-wise; `tmp` (same length) is scratch for types
    /// that widen through a slice conversion.
    #[inline]
    fn accumulate(acc: &mut [Self::Acc], src: &[Self], tmp: &mut [Self::Acc], op: ReduceOp) {
        Self::widen_block(src, tmp);
        op.combine_with(acc, tmp, |x| x);
    }
    /// The value's bit pattern for payload hashes (the f32 pattern of the widened value for
    /// the f32 family, so their hashes are `fault::hash_f32_bits`'s).
    fn hash_bits(self) -> u64;
    /// `|self|` as f64, to find the largest element (fault injection).
    fn magnitude(self) -> f64;
    /// The value with one significant bit flipped: bit 22 (f32's top mantissa bit, exact
    /// through bf16 and f16, and a visible change of an integer) or f64's top mantissa bit.
    fn flip_bit(self) -> Self;
    /// Tags a shared slice.
    fn buf_ref(s: &[Self]) -> BufRef<'_>;
    /// Tags a mutable slice.
    fn buf_mut(s: &mut [Self]) -> BufMut<'_>;
}

/// The [`Element`]s reduced in f32, which widen to it exactly: `f32`, `bf16` and `f16`
/// (what model states are stored as).
pub trait F32Element: Element<Acc = f32> {
    /// Widens one value to `f32` (exact).
    fn to_f32(self) -> f32;
    /// Rounds an `f32` to this type (round to nearest even).
    fn from_f32(v: f32) -> Self;
    /// Widens `src` into `dst` (same length); the hot loop of every reduction.
    fn load_block(src: &[Self], dst: &mut [f32]);
    /// Rounds `src` into `dst` (same length).
    fn store_block(src: &[f32], dst: &mut [Self]);
}

/// The [`Element`] items an [`F32Element`] gets from its f32 conversions (f32 and bf16 also
/// override the accumulate loops with a fused widening).
macro_rules! f32_family {
    ($t:ty, $variant:ident) => {
        const DTYPE: DType = DType::$variant;
        type Acc = f32;
        #[inline]
        fn widen_block(src: &[Self], dst: &mut [f32]) {
            <$t as F32Element>::load_block(src, dst);
        }
        #[inline]
        fn narrow_block(src: &[f32], dst: &mut [Self]) {
            <$t as F32Element>::store_block(src, dst);
        }
        fn hash_bits(self) -> u64 {
            u64::from(F32Element::to_f32(self).to_bits())
        }
        fn magnitude(self) -> f64 {
            f64::from(F32Element::to_f32(self).abs())
        }
        fn flip_bit(self) -> Self {
            let bits = F32Element::to_f32(self).to_bits() ^ (1 << 22);
            <$t as F32Element>::from_f32(f32::from_bits(bits))
        }
        fn buf_ref(s: &[Self]) -> BufRef<'_> {
            BufRef::$variant(s)
        }
        fn buf_mut(s: &mut [Self]) -> BufMut<'_> {
            BufMut::$variant(s)
        }
    };
}

/// An [`Element`] that accumulates in itself (no widening): i32, i64, f64.
macro_rules! exact_element {
    ($t:ty, $variant:ident, hash: $hash:expr, magnitude: $mag:expr, flip: $flip:expr) => {
        impl Element for $t {
            const DTYPE: DType = DType::$variant;
            type Acc = $t;
            #[inline]
            fn widen_block(src: &[Self], dst: &mut [Self]) {
                dst.copy_from_slice(src);
            }
            #[inline]
            fn narrow_block(src: &[Self], dst: &mut [Self]) {
                dst.copy_from_slice(src);
            }
            #[inline]
            fn accumulate(acc: &mut [Self], src: &[Self], _tmp: &mut [Self], op: ReduceOp) {
                op.combine_with(acc, src, |x| x);
            }
            #[inline]
            fn accumulate2(acc: &mut [Self], a: &[Self], b: &[Self], _: &mut [Self], op: ReduceOp) {
                op.combine2_with(acc, a, b, |x| x);
            }
            fn hash_bits(self) -> u64 {
                $hash(self)
            }
            fn magnitude(self) -> f64 {
                $mag(self)
            }
            fn flip_bit(self) -> Self {
                $flip(self)
            }
            fn buf_ref(s: &[Self]) -> BufRef<'_> {
                BufRef::$variant(s)
            }
            fn buf_mut(s: &mut [Self]) -> BufMut<'_> {
                BufMut::$variant(s)
            }
        }
    };
}

exact_element!(i32, I32,
    hash: |x: i32| u64::from(x as u32),
    magnitude: |x: i32| f64::from(x.unsigned_abs()),
    flip: |x: i32| x ^ (1 << 22));
exact_element!(i64, I64,
    hash: |x: i64| x as u64,
    // The nearest f64: fine for finding the largest element.
    magnitude: |x: i64| x.unsigned_abs() as f64,
    flip: |x: i64| x ^ (1 << 22));
exact_element!(f64, F64,
    hash: f64::to_bits,
    magnitude: f64::abs,
    flip: |x: f64| f64::from_bits(x.to_bits() ^ (1 << 51)));

impl Element for f32 {
    f32_family!(f32, F32);
    #[inline]
    fn accumulate(acc: &mut [f32], src: &[Self], _tmp: &mut [f32], op: ReduceOp) {
        op.combine_with(acc, src, |x| x);
    }
    #[inline]
    fn accumulate2(acc: &mut [f32], a: &[Self], b: &[Self], _tmp: &mut [f32], op: ReduceOp) {
        op.combine2_with(acc, a, b, |x| x);
    }
}

impl F32Element for f32 {
    #[inline]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline]
    fn from_f32(v: f32) -> Self {
        v
    }
    #[inline]
    fn load_block(src: &[Self], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }
    #[inline]
    fn store_block(src: &[f32], dst: &mut [Self]) {
        dst.copy_from_slice(src);
    }
}

/// bf16 -> f32 is a 16-bit shift; written by hand because `half`'s slice conversion for bf16
/// is a scalar loop that caps reductions near 4-5 GB/s, while this form vectorises.
#[inline]
fn bf16_to_f32(x: bf16) -> f32 {
    f32::from_bits(u32::from(x.to_bits()) << 16)
}
/// f32 bits -> bf16 bits, round to nearest even; NaN stays a (quiet) NaN. Integer-only and
/// select-based so the slice loop vectorises (a float NaN test kept it near 8 GB/s).
#[inline(always)]
fn f32_bits_to_bf16_bits(bits: u32) -> u16 {
    let rounded = bits.wrapping_add(0x7FFF + ((bits >> 16) & 1)) >> 16;
    let quiet_nan = (bits >> 16) | 0x0040;
    let is_nan = (bits & 0x7FFF_FFFF) > 0x7F80_0000;
    (if is_nan { quiet_nan } else { rounded }) as u16
}

#[inline(always)]
fn store_bf16(src: &[f32], dst: &mut [u16]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = f32_bits_to_bf16_bits(s.to_bits());
    }
}

/// [`store_bf16`] compiled for AVX2: the default x86-64 target (SSE2) has no packed
/// 32-to-16-bit narrowing, so the portable build runs this loop scalar (~6 GB/s).
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn store_bf16_avx2(src: &[f32], dst: &mut [u16]) {
    store_bf16(src, dst);
}

#[inline]
fn f32_to_bf16(v: f32) -> bf16 {
    bf16::from_bits(f32_bits_to_bf16_bits(v.to_bits()))
}

impl Element for bf16 {
    f32_family!(bf16, Bf16);
    #[inline]
    fn accumulate(acc: &mut [f32], src: &[Self], _tmp: &mut [f32], op: ReduceOp) {
        op.combine_with(acc, src, bf16_to_f32);
    }
    #[inline]
    fn accumulate2(acc: &mut [f32], a: &[Self], b: &[Self], _tmp: &mut [f32], op: ReduceOp) {
        op.combine2_with(acc, a, b, bf16_to_f32);
    }
}

impl F32Element for bf16 {
    #[inline]
    fn to_f32(self) -> f32 {
        bf16_to_f32(self)
    }
    #[inline]
    fn from_f32(v: f32) -> Self {
        f32_to_bf16(v)
    }
    #[inline]
    fn load_block(src: &[Self], dst: &mut [f32]) {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = bf16_to_f32(*s);
        }
    }
    #[inline]
    fn store_block(src: &[f32], dst: &mut [Self]) {
        // Work on the raw bits (bf16 is Pod) so the loop is plain integer SIMD.
        let dst: &mut [u16] = bytemuck::cast_slice_mut(dst);
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2 (checked on the line above).
            unsafe { store_bf16_avx2(src, dst) };
            return;
        }
        store_bf16(src, dst);
    }
}

impl Element for f16 {
    f32_family!(f16, F16);
}

impl F32Element for f16 {
    #[inline]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[inline]
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
    #[inline]
    fn load_block(src: &[Self], dst: &mut [f32]) {
        use half::slice::HalfFloatSliceExt;
        // `half` uses F16C here when the CPU has it (runtime detection).
        src.convert_to_f32_slice(dst);
    }
    #[inline]
    fn store_block(src: &[f32], dst: &mut [Self]) {
        use half::slice::HalfFloatSliceExt;
        dst.convert_from_f32_slice(src);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounding_matches_half_crate() {
        for bits in (0u32..=u32::MAX).step_by(65_537) {
            let v = f32::from_bits(bits);
            let ours = f32_to_bf16(v);
            let theirs = bf16::from_f32(v);
            if v.is_nan() {
                assert!(ours.is_nan());
            } else {
                assert_eq!(ours.to_bits(), theirs.to_bits(), "{v:e}");
            }
        }
    }

    #[test]
    fn bf16_store_block_matches_half_crate() {
        let src: Vec<f32> = (0u32..=u32::MAX)
            .step_by(40_009)
            .map(f32::from_bits)
            .collect();
        let mut dst = vec![bf16::ZERO; src.len()];
        bf16::store_block(&src, &mut dst);
        for (v, got) in src.iter().zip(&dst) {
            if v.is_nan() {
                assert!(got.is_nan());
            } else {
                assert_eq!(got.to_bits(), bf16::from_f32(*v).to_bits(), "{v:e}");
            }
        }
    }

    #[test]
    fn bf16_widening_is_exact() {
        for bits in (0u16..=u16::MAX).step_by(7) {
            let x = bf16::from_bits(bits);
            if !x.is_nan() {
                assert_eq!(bf16_to_f32(x), x.to_f32());
            }
        }
    }
}
