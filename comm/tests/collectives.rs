//! Every collective against the naive f64 reference: random group sizes 1..=8, lengths
//! including 0, 1 and non-multiples of N, every dtype and reduction, in place and not.

mod common;

use common::{assert_close, data, reference, run, FromF64, OPS};
use half::{bf16, f16};
use proptest::prelude::*;
use zero_comm::{local, ReduceOp};

fn all_reduce_case<T: FromF64>(n: usize, len: usize, op: ReduceOp, in_place: bool, seed: u64) {
    let inputs: Vec<Vec<T>> = (0..n).map(|r| data(seed, r, len)).collect();
    let want = reference(&inputs, op);
    let got = run(local::create(n).unwrap(), |c| {
        let input = &inputs[c.rank()];
        if in_place {
            let mut buf = input.clone();
            c.all_reduce_in_place(&mut buf, op).unwrap();
            buf
        } else {
            let mut out = vec![T::default(); len];
            c.all_reduce(input, &mut out, op).unwrap();
            out
        }
    });
    for (r, g) in got.iter().enumerate() {
        assert_close(g, &want, op, &format!("all_reduce rank {r}"));
    }
}

fn reduce_scatter_case<T: FromF64>(n: usize, per: usize, op: ReduceOp, in_place: bool, seed: u64) {
    let inputs: Vec<Vec<T>> = (0..n).map(|r| data(seed, r, n * per)).collect();
    let want = reference(&inputs, op);
    let got = run(local::create(n).unwrap(), |c| {
        let (r, input) = (c.rank(), &inputs[c.rank()]);
        if in_place {
            let mut buf = input.clone();
            c.reduce_scatter_in_place(&mut buf, op).unwrap();
            // The rest of the buffer is untouched.
            assert_eq!(&buf[..r * per], &input[..r * per]);
            buf[r * per..(r + 1) * per].to_vec()
        } else {
            let mut out = vec![T::default(); per];
            c.reduce_scatter(input, &mut out, op).unwrap();
            out
        }
    });
    for (r, g) in got.iter().enumerate() {
        assert_close(
            g,
            &want[r * per..(r + 1) * per],
            op,
            &format!("reduce_scatter rank {r}"),
        );
    }
}

fn all_gather_case<T: FromF64>(n: usize, per: usize, in_place: bool, seed: u64) {
    let shards: Vec<Vec<T>> = (0..n).map(|r| data(seed, r, per)).collect();
    let want: Vec<T> = shards.concat();
    let got = run(local::create(n).unwrap(), |c| {
        let r = c.rank();
        let mut out = vec![T::default(); n * per];
        if in_place {
            out[r * per..(r + 1) * per].copy_from_slice(&shards[r]);
            c.all_gather_in_place(&mut out).unwrap();
        } else {
            c.all_gather(&shards[r], &mut out).unwrap();
        }
        out
    });
    for g in got {
        assert_eq!(g, want);
    }
}

fn broadcast_case<T: FromF64>(n: usize, len: usize, root: usize, in_place: bool, seed: u64) {
    let inputs: Vec<Vec<T>> = (0..n).map(|r| data(seed, r, len)).collect();
    let got = run(local::create(n).unwrap(), |c| {
        let input = &inputs[c.rank()];
        if in_place {
            let mut buf = input.clone();
            c.broadcast_in_place(&mut buf, root).unwrap();
            buf
        } else {
            let mut out = vec![T::default(); len];
            c.broadcast(input, &mut out, root).unwrap();
            out
        }
    });
    for g in got {
        assert_eq!(g, inputs[root]);
    }
}

fn reduce_case<T: FromF64>(
    n: usize,
    len: usize,
    op: ReduceOp,
    root: usize,
    in_place: bool,
    seed: u64,
) {
    let inputs: Vec<Vec<T>> = (0..n).map(|r| data(seed, r, len)).collect();
    let want = reference(&inputs, op);
    let got = run(local::create(n).unwrap(), |c| {
        let input = &inputs[c.rank()];
        if in_place {
            let mut buf = input.clone();
            c.reduce_in_place(&mut buf, op, root).unwrap();
            if c.rank() != root {
                assert_eq!(&buf, input, "a non-root input must be left as it was");
            }
            buf
        } else {
            // Non-roots may pass an empty receive buffer.
            let mut out = vec![T::default(); if c.rank() == root { len } else { 0 }];
            c.reduce(input, &mut out, op, root).unwrap();
            out
        }
    });
    assert_close(&got[root], &want, op, "reduce at root");
}

macro_rules! per_dtype {
    ($d:expr, $f:ident ( $($arg:expr),* )) => {
        match $d {
            0 => $f::<f32>($($arg),*),
            1 => $f::<bf16>($($arg),*),
            _ => $f::<f16>($($arg),*),
        }
    };
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn all_reduce_matches_reference(n in 1usize..=8, len in prop_oneof![Just(0usize), Just(1), 0usize..70],
            dtype in 0usize..3, op in 0usize..4, in_place: bool, seed: u64) {
        per_dtype!(dtype, all_reduce_case(n, len, OPS[op], in_place, seed));
    }

    #[test]
    fn reduce_scatter_matches_reference(n in 1usize..=8, per in 0usize..9,
            dtype in 0usize..3, op in 0usize..4, in_place: bool, seed: u64) {
        per_dtype!(dtype, reduce_scatter_case(n, per, OPS[op], in_place, seed));
    }

    #[test]
    fn all_gather_concatenates_shards(n in 1usize..=8, per in 0usize..9, dtype in 0usize..3,
            in_place: bool, seed: u64) {
        per_dtype!(dtype, all_gather_case(n, per, in_place, seed));
    }

    #[test]
    fn broadcast_copies_root(n in 1usize..=8, len in 0usize..40, root in 0usize..8,
            dtype in 0usize..3, in_place: bool, seed: u64) {
        per_dtype!(dtype, broadcast_case(n, len, root % n, in_place, seed));
    }

    #[test]
    fn reduce_matches_reference_at_root(n in 1usize..=8, len in 0usize..40, root in 0usize..8,
            dtype in 0usize..3, op in 0usize..4, in_place: bool, seed: u64) {
        per_dtype!(dtype, reduce_case(n, len, OPS[op], root % n, in_place, seed));
    }
}

#[test]
fn large_all_reduce_crosses_block_boundaries() {
    // 3 ranks x 10_007 elements: chunks are uneven and span several kernel blocks.
    all_reduce_case::<bf16>(3, 10_007, ReduceOp::Sum, false, 7);
    all_reduce_case::<f32>(3, 10_007, ReduceOp::Avg, true, 8);
}
