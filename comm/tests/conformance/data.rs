//! Deterministic inputs and the naive f64 reference the cases check against.

use half::{bf16, f16};
use zero_comm::{Element, ReduceOp};

use super::Result;

/// An element type with test-side conversions from and to f64 (the `half` crate's and Rust's
/// casts, not zero-comm's).
pub trait Val: Element {
    /// Rounds once, to nearest even (exact for the integers the data uses).
    fn from_f64(v: f64) -> Self;
    /// The value as f64 (exact for every value the data uses).
    fn to_f64(self) -> f64;
    /// Relative precision, for avg (which rounds twice: f32 divide, then to the type).
    const EPS: f64;
    /// Spacing of the small values `data` draws: 1/4 for floats, 1 for integers.
    const STEP: f64;
    /// True for the integer types, which have no avg.
    const INTEGER: bool;
}

macro_rules! val {
    ($t:ty, eps: $eps:expr, step: $step:expr, int: $int:expr, $from:expr, $to:expr) => {
        impl Val for $t {
            fn from_f64(v: f64) -> Self {
                $from(v)
            }
            fn to_f64(self) -> f64 {
                $to(self)
            }
            const EPS: f64 = $eps;
            const STEP: f64 = $step;
            const INTEGER: bool = $int;
        }
    };
}
val!(f32, eps: 1.0 / (1u64 << 23) as f64, step: 0.25, int: false, |v| v as f32, f64::from);
val!(bf16, eps: 1.0 / 128.0, step: 0.25, int: false, bf16::from_f64, bf16::to_f64);
val!(f16, eps: 1.0 / 1024.0, step: 0.25, int: false, f16::from_f64, f16::to_f64);
val!(f64, eps: f64::EPSILON, step: 0.25, int: false, |v| v, |v| v);
val!(i32, eps: 0.0, step: 1.0, int: true, |v| v as i32, f64::from);
val!(i64, eps: 0.0, step: 1.0, int: true, |v| v as i64, |v| v as f64);

fn mix(seed: u64, rank: usize, i: usize) -> u64 {
    let mut x = seed ^ ((rank as u64) << 40) ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^= x >> 31;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 29;
    x
}

/// Multiples of 1/4 in [-16, 16] (integers: of 1 in [-64, 64]): f32 sums of a few are
/// exact, so the only rounding left is the final one, which the f64 reference does too.
pub fn data<T: Val>(seed: u64, rank: usize, len: usize) -> Vec<T> {
    (0..len)
        .map(|i| T::from_f64(((mix(seed, rank, i) % 129) as i64 - 64) as f64 * T::STEP))
        .collect()
}

/// Values spread over the whole range of an integer type, a quarter of them at its limits,
/// so that sums of two or more wrap.
pub fn wide_ints(seed: u64, rank: usize, len: usize) -> Vec<u64> {
    (0..len)
        .map(|i| match mix(seed, rank, i) % 8 {
            0 => u64::MAX >> 1, // MAX
            1 => 1 << 63,       // MIN
            _ => mix(seed ^ 0xA5A5, rank, i),
        })
        .collect()
}

/// The rank-order loop for integers: wrapping sums, max and min (no avg), written with
/// Rust's own integer operations.
pub fn int_rank_order<T: Copy + Ord>(
    inputs: &[Vec<T>],
    op: ReduceOp,
    wrapping_add: impl Fn(T, T) -> T,
) -> Vec<T> {
    let len = inputs.first().map_or(0, Vec::len);
    (0..len)
        .map(|i| {
            let mut acc = inputs[0][i];
            for input in &inputs[1..] {
                acc = match op {
                    ReduceOp::Sum => wrapping_add(acc, input[i]),
                    ReduceOp::Max => acc.max(input[i]),
                    ReduceOp::Min => acc.min(input[i]),
                    ReduceOp::Avg => unreachable!("integers have no avg"),
                };
            }
            acc
        })
        .collect()
}

/// The rank-order loop for f64: combine in f64 over ranks 0..N-1, avg divided by N.
pub fn f64_rank_order(inputs: &[Vec<f64>], op: ReduceOp) -> Vec<f64> {
    let len = inputs.first().map_or(0, Vec::len);
    (0..len)
        .map(|i| {
            let mut acc = inputs[0][i];
            for input in &inputs[1..] {
                acc = match op {
                    ReduceOp::Sum | ReduceOp::Avg => acc + input[i],
                    ReduceOp::Max => acc.max(input[i]),
                    ReduceOp::Min => acc.min(input[i]),
                };
            }
            if op == ReduceOp::Avg {
                acc /= inputs.len() as f64;
            }
            acc
        })
        .collect()
}

/// f64 values with all 52 mantissa bits used, of many magnitudes: sums round, so the order
/// of reduction shows in the bits.
pub fn rough_f64(seed: u64, rank: usize, len: usize) -> Vec<f64> {
    (0..len)
        .map(|i| {
            let x = mix(seed, rank, i);
            let mantissa = 1.0 + (x >> 12) as f64 / (1u64 << 52) as f64;
            let exp = (mix(seed ^ 7, rank, i) % 40) as i32 - 20;
            let sign = if x & 1 == 1 { -1.0 } else { 1.0 };
            sign * mantissa * 2f64.powi(exp)
        })
        .collect()
}

/// Values of many magnitudes, whose f32 sums round: the order of reduction shows in the bits.
pub fn rough<T: Val>(seed: u64, rank: usize, len: usize) -> Vec<T> {
    (0..len)
        .map(|i| {
            let x = mix(seed, rank, i);
            let mantissa = (x & 0xFF_FFFF) as f64 / (1u64 << 24) as f64 + 0.5;
            let exp = ((x >> 24) % 16) as i32 - 8;
            let sign = if x >> 63 == 1 { -1.0 } else { 1.0 };
            T::from_f64(sign * mantissa * 2f64.powi(exp))
        })
        .collect()
}

/// Every rank's input, as every rank can compute it.
pub fn inputs<T: Val>(seed: u64, n: usize, len: usize) -> Vec<Vec<T>> {
    (0..n).map(|r| data(seed, r, len)).collect()
}

/// Element i of the result is `op` over element i of every input, in f64, rounded once.
pub fn reference<T: Val>(inputs: &[Vec<T>], op: ReduceOp) -> Vec<T> {
    let len = inputs.first().map_or(0, Vec::len);
    (0..len)
        .map(|i| {
            let vals = inputs.iter().map(|v| v[i].to_f64());
            T::from_f64(match op {
                ReduceOp::Sum => vals.sum(),
                ReduceOp::Avg => vals.sum::<f64>() / inputs.len() as f64,
                ReduceOp::Max => vals.fold(f64::NEG_INFINITY, f64::max),
                ReduceOp::Min => vals.fold(f64::INFINITY, f64::min),
            })
        })
        .collect()
}

/// Element i of the result as the backends promise to compute it: f32 accumulation over the
/// inputs in rank order, avg divided by the count in f32, one rounding to `T` at the end.
/// A plain loop, sharing nothing with the backends' kernels.
pub fn rank_order<T: Val>(inputs: &[Vec<T>], op: ReduceOp) -> Vec<T> {
    let len = inputs.first().map_or(0, Vec::len);
    (0..len)
        .map(|i| {
            let mut acc = inputs[0][i].to_f64() as f32;
            for input in &inputs[1..] {
                let x = input[i].to_f64() as f32;
                acc = match op {
                    ReduceOp::Sum | ReduceOp::Avg => acc + x,
                    ReduceOp::Max => acc.max(x),
                    ReduceOp::Min => acc.min(x),
                };
            }
            if op == ReduceOp::Avg {
                acc /= inputs.len() as f32;
            }
            // f32 to f64 is exact, so this is the one rounding to T.
            T::from_f64(f64::from(acc))
        })
        .collect()
}

/// Exact equality, except avg, which may differ by one unit in the last place.
pub fn close<T: Val>(got: &[T], want: &[T], op: ReduceOp, what: &str) -> Result {
    ensure!(
        got.len() == want.len(),
        "{what}: {} elements, want {}",
        got.len(),
        want.len()
    );
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let (g, w) = (g.to_f64(), w.to_f64());
        let tol = if op == ReduceOp::Avg {
            w.abs() * T::EPS * 1.01
        } else {
            0.0
        };
        let within = (g - w).abs() <= tol;
        ensure!(within, "{what}: element {i}: got {g}, want {w} ({op})");
    }
    Ok(())
}

/// Bitwise equality (NaN-free data, so `==` on bits is what we mean).
pub fn same_bits<T: Element>(got: &[T], want: &[T], what: &str) -> Result {
    ensure!(got.len() == want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        ensure!(
            bytemuck::bytes_of(g) == bytemuck::bytes_of(w),
            "{what}: element {i}: got {:?}, want {:?}",
            g,
            w
        );
    }
    Ok(())
}

/// Every reduction.
pub const OPS: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min];
