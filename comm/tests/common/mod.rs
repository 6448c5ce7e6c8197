//! Helpers shared by the integration tests: run one closure per rank, deterministic data,
//! and the naive f64 reference.
#![allow(dead_code, reason = "each test binary uses a different subset")]

use half::{bf16, f16};
use zero_comm::{Communicator, F32Element, ReduceOp};

/// Runs `f` on every rank's thread and returns the results in rank order.
pub fn run<R: Send>(comms: Vec<Communicator>, f: impl Fn(Communicator) -> R + Sync) -> Vec<R> {
    let f = &f;
    std::thread::scope(|s| {
        let handles: Vec<_> = comms.into_iter().map(|c| s.spawn(move || f(c))).collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank thread panicked"))
            .collect()
    })
}

/// Rounds an f64 to the element type (the reference's single rounding).
pub trait FromF64: F32Element {
    fn from_f64(v: f64) -> Self;
    /// Relative precision (2^-mantissa bits) for the avg tolerance.
    const EPS: f64;
}
impl FromF64 for f32 {
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    const EPS: f64 = 1.0 / (1 << 23) as f64;
}
impl FromF64 for bf16 {
    fn from_f64(v: f64) -> Self {
        bf16::from_f64(v)
    }
    const EPS: f64 = 1.0 / 128.0;
}
impl FromF64 for f16 {
    fn from_f64(v: f64) -> Self {
        f16::from_f64(v)
    }
    const EPS: f64 = 1.0 / 1024.0;
}

/// A value in [-16, 16] in steps of 1/4, so f32 sums of up to 8 are exact: the only rounding
/// left is the final one, which the reference does too.
pub fn val(seed: u64, rank: usize, i: usize) -> f64 {
    let mut x = seed ^ ((rank as u64) << 40) ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^= x >> 31;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 29;
    ((x % 129) as i64 - 64) as f64 * 0.25
}

pub fn data<T: FromF64>(seed: u64, rank: usize, len: usize) -> Vec<T> {
    (0..len).map(|i| T::from_f64(val(seed, rank, i))).collect()
}

/// The naive reference: reduce element i of every rank's input in f64, then round once.
pub fn reference<T: FromF64>(inputs: &[Vec<T>], op: ReduceOp) -> Vec<T> {
    let len = inputs.first().map_or(0, Vec::len);
    (0..len)
        .map(|i| {
            let vals = inputs.iter().map(|v| f64::from(v[i].to_f32()));
            let r = match op {
                ReduceOp::Sum => vals.sum(),
                ReduceOp::Avg => vals.sum::<f64>() / inputs.len() as f64,
                ReduceOp::Max => vals.fold(f64::NEG_INFINITY, f64::max),
                ReduceOp::Min => vals.fold(f64::INFINITY, f64::min),
            };
            T::from_f64(r)
        })
        .collect()
}

/// Exact equality, except avg, which rounds twice (f32 divide, then to T) and may differ by
/// one unit in the last place of T.
pub fn assert_close<T: FromF64>(got: &[T], want: &[T], op: ReduceOp, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let (g, w) = (f64::from(g.to_f32()), f64::from(w.to_f32()));
        let tol = if op == ReduceOp::Avg {
            w.abs() * T::EPS * 1.01
        } else {
            0.0
        };
        assert!(
            (g - w).abs() <= tol,
            "{what}: element {i}: got {g}, want {w} ({op})"
        );
    }
}

pub const OPS: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min];
