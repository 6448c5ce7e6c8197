//! Deterministic inputs and the naive f64 reference the cases check against.

use half::{bf16, f16};
use zero_comm::{Element, ReduceOp};

use super::Result;

/// An element type with a test-side rounding from f64.
pub trait Val: Element {
    /// Rounds once, to nearest even.
    fn from_f64(v: f64) -> Self;
    /// Relative precision, for avg (which rounds twice: f32 divide, then to the type).
    const EPS: f64;
}
impl Val for f32 {
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    const EPS: f64 = 1.0 / (1u64 << 23) as f64;
}
impl Val for bf16 {
    fn from_f64(v: f64) -> Self {
        bf16::from_f64(v)
    }
    const EPS: f64 = 1.0 / 128.0;
}
impl Val for f16 {
    fn from_f64(v: f64) -> Self {
        f16::from_f64(v)
    }
    const EPS: f64 = 1.0 / 1024.0;
}

fn mix(seed: u64, rank: usize, i: usize) -> u64 {
    let mut x = seed ^ ((rank as u64) << 40) ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^= x >> 31;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 29;
    x
}

/// Multiples of 1/4 in [-16, 16]: f32 sums of a few are exact, so the only rounding left is
/// the final one, which the f64 reference does too.
pub fn data<T: Val>(seed: u64, rank: usize, len: usize) -> Vec<T> {
    (0..len)
        .map(|i| T::from_f64(((mix(seed, rank, i) % 129) as i64 - 64) as f64 * 0.25))
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
            let vals = inputs.iter().map(|v| f64::from(v[i].to_f32()));
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
            let mut acc = inputs[0][i].to_f32();
            for input in &inputs[1..] {
                let x = input[i].to_f32();
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
        let (g, w) = (f64::from(g.to_f32()), f64::from(w.to_f32()));
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
pub fn same_bits<T: Val>(got: &[T], want: &[T], what: &str) -> Result {
    ensure!(got.len() == want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        ensure!(
            g.to_f32().to_bits() == w.to_f32().to_bits(),
            "{what}: element {i}: got {:?}, want {:?}",
            g,
            w
        );
    }
    Ok(())
}

/// Every reduction.
pub const OPS: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min];
