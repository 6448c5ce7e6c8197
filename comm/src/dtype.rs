//! Element types a collective can move, and dtype-tagged buffer views for backends.
//!
//! Backends see buffers as [`BufRef`] / [`BufMut`] (an enum over the element types) so the
//! [`Backend`](crate::Backend) trait stays object-safe; users see generic `&[T]` through the
//! [`Element`] trait.

use half::{bf16, f16};

use crate::reduce_op::ReduceOp;

/// The element type of a buffer, named as nccl-tests names it in its `type` column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// bfloat16 (8-bit exponent, 7-bit mantissa).
    Bf16,
    /// IEEE binary16.
    F16,
}

impl DType {
    /// Every type, in declaration order (their wire codes are their indices here).
    pub const ALL: [DType; 3] = [DType::F32, DType::Bf16, DType::F16];

    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::Bf16 | DType::F16 => 2,
        }
    }

    /// The nccl-tests name (`float`, `bfloat16`, `half`).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "float",
            DType::Bf16 => "bfloat16",
            DType::F16 => "half",
        }
    }

    /// Parses nccl-tests names and common aliases (`float`/`f32`, `bfloat16`/`bf16`, `half`/`f16`).
    pub fn parse(s: &str) -> Option<DType> {
        match s {
            "float" | "f32" | "float32" => Some(DType::F32),
            "bfloat16" | "bf16" => Some(DType::Bf16),
            "half" | "f16" | "float16" => Some(DType::F16),
            _ => None,
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::bf16 {}
    impl Sealed for half::f16 {}
}

/// A type a collective can reduce: `f32`, `bf16` or `f16`. Half types are widened to `f32`
/// for accumulation and rounded once at the end.
pub trait Element:
    sealed::Sealed + Copy + Send + Sync + PartialEq + std::fmt::Debug + Default + 'static
{
    /// The tag of this type.
    const DTYPE: DType;
    /// Widens one value to `f32` (exact for every type here).
    fn to_f32(self) -> f32;
    /// Rounds an `f32` to this type (round to nearest even).
    fn from_f32(v: f32) -> Self;
    /// Widens `src` into `dst` (same length); the hot loop of every reduction.
    fn load_block(src: &[Self], dst: &mut [f32]);
    /// Rounds `src` into `dst` (same length).
    fn store_block(src: &[f32], dst: &mut [Self]);
    /// `acc = op(widen(a), widen(b))` element-wise (the first two inputs, fused).
    #[inline]
    fn accumulate2(acc: &mut [f32], a: &[Self], b: &[Self], tmp: &mut [f32], op: ReduceOp) {
        Self::load_block(a, acc);
        Self::accumulate(acc, b, tmp, op);
    }
    /// `acc = op(acc, widen(src))` element-wise; `tmp` (same length) is scratch for types
    /// that widen through a slice conversion.
    #[inline]
    fn accumulate(acc: &mut [f32], src: &[Self], tmp: &mut [f32], op: ReduceOp) {
        Self::load_block(src, tmp);
        op.combine_with(acc, tmp, |x| x);
    }
    /// Tags a shared slice.
    fn buf_ref(s: &[Self]) -> BufRef<'_>;
    /// Tags a mutable slice.
    fn buf_mut(s: &mut [Self]) -> BufMut<'_>;
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
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
    #[inline]
    fn accumulate(acc: &mut [f32], src: &[Self], _tmp: &mut [f32], op: ReduceOp) {
        op.combine_with(acc, src, |x| x);
    }
    #[inline]
    fn accumulate2(acc: &mut [f32], a: &[Self], b: &[Self], _tmp: &mut [f32], op: ReduceOp) {
        op.combine2_with(acc, a, b, |x| x);
    }
    fn buf_ref(s: &[Self]) -> BufRef<'_> {
        BufRef::F32(s)
    }
    fn buf_mut(s: &mut [Self]) -> BufMut<'_> {
        BufMut::F32(s)
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
    const DTYPE: DType = DType::Bf16;
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
    #[inline]
    fn accumulate(acc: &mut [f32], src: &[Self], _tmp: &mut [f32], op: ReduceOp) {
        op.combine_with(acc, src, bf16_to_f32);
    }
    #[inline]
    fn accumulate2(acc: &mut [f32], a: &[Self], b: &[Self], _tmp: &mut [f32], op: ReduceOp) {
        op.combine2_with(acc, a, b, bf16_to_f32);
    }
    fn buf_ref(s: &[Self]) -> BufRef<'_> {
        BufRef::Bf16(s)
    }
    fn buf_mut(s: &mut [Self]) -> BufMut<'_> {
        BufMut::Bf16(s)
    }
}

impl Element for f16 {
    const DTYPE: DType = DType::F16;
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
    fn buf_ref(s: &[Self]) -> BufRef<'_> {
        BufRef::F16(s)
    }
    fn buf_mut(s: &mut [Self]) -> BufMut<'_> {
        BufMut::F16(s)
    }
}

/// A dtype-tagged shared buffer: what a [`Backend`](crate::Backend) receives as input.
#[derive(Debug)]
pub enum BufRef<'a> {
    /// f32 elements.
    F32(&'a [f32]),
    /// bf16 elements.
    Bf16(&'a [bf16]),
    /// f16 elements.
    F16(&'a [f16]),
}

/// A dtype-tagged mutable buffer: what a [`Backend`](crate::Backend) writes results into.
#[derive(Debug)]
pub enum BufMut<'a> {
    /// f32 elements.
    F32(&'a mut [f32]),
    /// bf16 elements.
    Bf16(&'a mut [bf16]),
    /// f16 elements.
    F16(&'a mut [f16]),
}

impl BufRef<'_> {
    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            BufRef::F32(_) => DType::F32,
            BufRef::Bf16(_) => DType::Bf16,
            BufRef::F16(_) => DType::F16,
        }
    }
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            BufRef::F32(s) => s.len(),
            BufRef::Bf16(s) => s.len(),
            BufRef::F16(s) => s.len(),
        }
    }
    /// True when the buffer holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Address of the first element (dangling but aligned when empty).
    pub fn as_ptr(&self) -> *const u8 {
        match self {
            BufRef::F32(s) => s.as_ptr().cast(),
            BufRef::Bf16(s) => s.as_ptr().cast(),
            BufRef::F16(s) => s.as_ptr().cast(),
        }
    }
}

impl BufMut<'_> {
    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            BufMut::F32(_) => DType::F32,
            BufMut::Bf16(_) => DType::Bf16,
            BufMut::F16(_) => DType::F16,
        }
    }
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            BufMut::F32(s) => s.len(),
            BufMut::Bf16(s) => s.len(),
            BufMut::F16(s) => s.len(),
        }
    }
    /// True when the buffer holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Address of the first element (dangling but aligned when empty).
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        match self {
            BufMut::F32(s) => s.as_mut_ptr().cast(),
            BufMut::Bf16(s) => s.as_mut_ptr().cast(),
            BufMut::F16(s) => s.as_mut_ptr().cast(),
        }
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
