//! Element types a collective can move, and dtype-tagged buffer views for backends.
//!
//! Backends see buffers as [`BufRef`] / [`BufMut`] (an enum over the element types) so the
//! [`Backend`](crate::Backend) trait stays object-safe; users see generic `&[T]` through the
//! [`Element`](crate::Element) trait. This file is the one table of the types: their sizes,
//! names and wire codes ([`DType::ALL`]), and the dispatch from a tag to a Rust type
//! ([`with_element!`](crate::with_element)).

use half::{bf16, f16};

/// The element type of a buffer, named as nccl-tests names it in its `type` column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// bfloat16 (8-bit exponent, 7-bit mantissa).
    Bf16,
    /// IEEE binary16.
    F16,
    /// Two's-complement 32-bit integer; sums wrap.
    I32,
    /// Two's-complement 64-bit integer; sums wrap.
    I64,
    /// IEEE binary64.
    F64,
}

impl DType {
    /// Every type, in declaration order (their wire codes are their indices here, so new
    /// types are appended).
    pub const ALL: [DType; 6] = [
        DType::F32,
        DType::Bf16,
        DType::F16,
        DType::I32,
        DType::I64,
        DType::F64,
    ];

    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            DType::Bf16 | DType::F16 => 2,
            DType::F32 | DType::I32 => 4,
            DType::I64 | DType::F64 => 8,
        }
    }

    /// Bytes of the largest element of any type (what staging rounds chunks to).
    pub const WIDEST: usize = {
        let mut widest = 0;
        let mut i = 0;
        while i < DType::ALL.len() {
            if DType::ALL[i].size() > widest {
                widest = DType::ALL[i].size();
            }
            i += 1;
        }
        widest
    };

    /// True for the integer types, whose sums wrap and which have no average.
    pub const fn is_integer(self) -> bool {
        matches!(self, DType::I32 | DType::I64)
    }

    /// The nccl-tests name (`float`, `bfloat16`, `half`, `int32`, `int64`, `double`).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "float",
            DType::Bf16 => "bfloat16",
            DType::F16 => "half",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::F64 => "double",
        }
    }

    /// Parses nccl-tests names and common aliases (`float`/`f32`, `bfloat16`/`bf16`,
    /// `half`/`f16`, `int32`/`i32`, `int64`/`i64`, `double`/`f64`).
    pub fn parse(s: &str) -> Option<DType> {
        match s {
            "float" | "f32" | "float32" => Some(DType::F32),
            "bfloat16" | "bf16" => Some(DType::Bf16),
            "half" | "f16" | "float16" => Some(DType::F16),
            "int32" | "i32" => Some(DType::I32),
            "int64" | "i64" => Some(DType::I64),
            "double" | "f64" | "float64" => Some(DType::F64),
            _ => None,
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Runs `$body` with the type alias `$T` bound to the Rust type of the [`DType`] `$dtype`
/// (`f32`, `bf16`, `f16`, `i32`, `i64`, `f64`): the one dispatch from a tag to a type.
///
/// ```
/// use zero_comm::{with_element, DType, Element};
///
/// let bytes = |d: DType| with_element!(d, T => std::mem::size_of::<T>());
/// assert!(DType::ALL.iter().all(|&d| bytes(d) == d.size()));
/// assert_eq!(with_element!(DType::I64, T => T::DTYPE), DType::I64);
/// ```
#[macro_export]
macro_rules! with_element {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            $crate::DType::F32 => {
                type $T = f32;
                $body
            }
            $crate::DType::Bf16 => {
                type $T = $crate::__private::bf16;
                $body
            }
            $crate::DType::F16 => {
                type $T = $crate::__private::f16;
                $body
            }
            $crate::DType::I32 => {
                type $T = i32;
                $body
            }
            $crate::DType::I64 => {
                type $T = i64;
                $body
            }
            $crate::DType::F64 => {
                type $T = f64;
                $body
            }
        }
    };
}

/// Declares a buffer enum with one variant per [`DType`] and a macro that matches every
/// variant with one body, so adding a type touches this list only.
macro_rules! tagged_buffers {
    ($($variant:ident($t:ty)),* $(,)?) => {
        /// A dtype-tagged shared buffer: what a [`Backend`](crate::Backend) receives as input.
        #[derive(Debug)]
        pub enum BufRef<'a> {
            $(
                #[doc = concat!("`", stringify!($t), "` elements.")]
                $variant(&'a [$t]),
            )*
        }

        /// A dtype-tagged mutable buffer: what a [`Backend`](crate::Backend) writes results
        /// into.
        #[derive(Debug)]
        pub enum BufMut<'a> {
            $(
                #[doc = concat!("`", stringify!($t), "` elements.")]
                $variant(&'a mut [$t]),
            )*
        }

        impl BufRef<'_> {
            /// The element type.
            pub fn dtype(&self) -> DType {
                match self {
                    $(BufRef::$variant(_) => DType::$variant,)*
                }
            }
            /// Number of elements.
            pub fn len(&self) -> usize {
                match self {
                    $(BufRef::$variant(s) => s.len(),)*
                }
            }
            /// Address of the first element (dangling but aligned when empty).
            pub fn as_ptr(&self) -> *const u8 {
                match self {
                    $(BufRef::$variant(s) => s.as_ptr().cast(),)*
                }
            }
            /// The elements' bytes.
            pub fn as_bytes(&self) -> &[u8] {
                match self {
                    $(BufRef::$variant(s) => bytemuck::cast_slice(s),)*
                }
            }
        }

        impl BufMut<'_> {
            /// The element type.
            pub fn dtype(&self) -> DType {
                match self {
                    $(BufMut::$variant(_) => DType::$variant,)*
                }
            }
            /// Number of elements.
            pub fn len(&self) -> usize {
                match self {
                    $(BufMut::$variant(s) => s.len(),)*
                }
            }
            /// Address of the first element (dangling but aligned when empty).
            pub fn as_mut_ptr(&mut self) -> *mut u8 {
                match self {
                    $(BufMut::$variant(s) => s.as_mut_ptr().cast(),)*
                }
            }
            /// The elements' bytes, writable.
            pub fn as_bytes_mut(&mut self) -> &mut [u8] {
                match self {
                    $(BufMut::$variant(s) => bytemuck::cast_slice_mut(s),)*
                }
            }
        }
    };
}

tagged_buffers!(F32(f32), Bf16(bf16), F16(f16), I32(i32), I64(i64), F64(f64));

impl BufRef<'_> {
    /// True when the buffer holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl BufMut<'_> {
    /// True when the buffer holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back_and_sizes_are_the_rust_types() {
        for d in DType::ALL {
            assert_eq!(DType::parse(d.name()), Some(d));
            assert_eq!(with_element!(d, T => std::mem::size_of::<T>()), d.size());
        }
        assert_eq!(DType::WIDEST, 8);
        assert_eq!(DType::parse("i64"), Some(DType::I64));
        assert_eq!(DType::parse("int16"), None);
    }

    #[test]
    fn buffers_report_their_tag_length_and_bytes() {
        let xs = [1i64, -2, 3];
        let b = BufRef::I64(&xs);
        assert_eq!(
            (b.dtype(), b.len(), b.as_bytes().len()),
            (DType::I64, 3, 24)
        );
        assert_eq!(&b.as_bytes()[8..16], &(-2i64).to_le_bytes());
        let mut ys = [0f64; 2];
        let mut m = BufMut::F64(&mut ys);
        m.as_bytes_mut()[..8].copy_from_slice(&1.5f64.to_le_bytes());
        assert_eq!(ys, [1.5, 0.0]);
    }
}
