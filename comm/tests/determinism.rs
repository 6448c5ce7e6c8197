//! Bitwise reproducibility: all-reduce equals reduce-scatter + all-gather, and repeats.

mod common;

use common::run;
use half::bf16;
use proptest::prelude::*;
use zero_comm::{local, ReduceOp};

fn noisy(seed: u64, rank: usize, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| {
            let x = (seed as f64 + 1.3 * rank as f64 + 0.77 * i as f64).sin() * 1e3;
            x as f32 / 7.0
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn all_reduce_is_bitwise_reduce_scatter_then_all_gather(n in 1usize..=8, per in 0usize..20, seed: u64, half: bool) {
        let len = n * per;
        let out = run(local::create(n).unwrap(), |c| {
            let input = noisy(seed, c.rank(), len);
            if half {
                let input: Vec<bf16> = input.iter().map(|&v| bf16::from_f32(v)).collect();
                let mut ar = input.clone();
                c.all_reduce_in_place(&mut ar, ReduceOp::Sum).unwrap();
                let mut zero = input.clone();
                c.reduce_scatter_in_place(&mut zero, ReduceOp::Sum).unwrap();
                c.all_gather_in_place(&mut zero).unwrap();
                ar.iter().zip(&zero).all(|(a, b)| a.to_bits() == b.to_bits())
            } else {
                let mut ar = input.clone();
                c.all_reduce_in_place(&mut ar, ReduceOp::Sum).unwrap();
                let mut shard = vec![0f32; per];
                c.reduce_scatter(&input, &mut shard, ReduceOp::Sum).unwrap();
                let mut zero = vec![0f32; len];
                c.all_gather(&shard, &mut zero).unwrap();
                ar.iter().zip(&zero).all(|(a, b)| a.to_bits() == b.to_bits())
            }
        });
        prop_assert!(out.iter().all(|&b| b));
    }
}

#[test]
fn results_are_reduced_in_rank_order() {
    // Summing in rank order 0..N-1 in f32: (1e8 + 1 - 1e8) + ... depends on order; check the
    // exact left-to-right value.
    let vals = [1.0e8f32, 1.0, -1.0e8, 1.0];
    let want = ((vals[0] + vals[1]) + vals[2]) + vals[3];
    let out = run(local::create(4).unwrap(), |c| {
        let mut x = vec![vals[c.rank()]; 5];
        c.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap();
        x
    });
    for x in out {
        assert!(x.iter().all(|v| v.to_bits() == want.to_bits()));
    }
}
