//! i32, i64 and f64 collectives against naive loops over random data of the whole range:
//! integer sums wrap (two's complement) and f64 combines in rank order, to the bit; avg on
//! integers is refused on every rank and leaves the group usable.

mod common;

use common::run;
use proptest::prelude::*;
use zero_comm::{local, CommError, ReduceOp};

const OPS: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min];

/// Element i of the result, rank by rank with Rust's own operators.
fn naive_i64(ins: &[Vec<i64>], op: ReduceOp) -> Vec<i64> {
    (0..ins[0].len())
        .map(|i| {
            let col = ins.iter().map(|v| v[i]);
            match op {
                ReduceOp::Sum => col.fold(0i64, i64::wrapping_add),
                ReduceOp::Max => col.max().unwrap(),
                ReduceOp::Min => col.min().unwrap(),
                ReduceOp::Avg => unreachable!(),
            }
        })
        .collect()
}

fn naive_i32(ins: &[Vec<i32>], op: ReduceOp) -> Vec<i32> {
    (0..ins[0].len())
        .map(|i| {
            let col = ins.iter().map(|v| v[i]);
            match op {
                ReduceOp::Sum => col.fold(0i32, i32::wrapping_add),
                ReduceOp::Max => col.max().unwrap(),
                ReduceOp::Min => col.min().unwrap(),
                ReduceOp::Avg => unreachable!(),
            }
        })
        .collect()
}

fn naive_f64(ins: &[Vec<f64>], op: ReduceOp) -> Vec<u64> {
    (0..ins[0].len())
        .map(|i| {
            let mut acc = ins[0][i];
            for v in &ins[1..] {
                acc = match op {
                    ReduceOp::Sum | ReduceOp::Avg => acc + v[i],
                    ReduceOp::Max => acc.max(v[i]),
                    ReduceOp::Min => acc.min(v[i]),
                };
            }
            if op == ReduceOp::Avg {
                acc /= ins.len() as f64;
            }
            acc.to_bits()
        })
        .collect()
}

/// All-reduce (out of place) and reduce-scatter (in place) of `ins` on a local group.
fn collectives<T: zero_comm::Element>(ins: &[Vec<T>], op: ReduceOp) -> Vec<(Vec<T>, Vec<T>)> {
    let n = ins.len();
    run(local::create(n).unwrap(), |c| {
        let mine = &ins[c.rank()];
        let mut ar = vec![T::default(); mine.len()];
        c.all_reduce(mine, &mut ar, op).unwrap();
        let mut rs = mine.clone();
        c.reduce_scatter_in_place(&mut rs, op).unwrap();
        let per = mine.len() / n;
        (ar, rs[c.rank() * per..(c.rank() + 1) * per].to_vec())
    })
}

fn check<T: zero_comm::Element>(ins: &[Vec<T>], op: ReduceOp, want: &[T]) {
    let per = want.len() / ins.len();
    for (r, (ar, rs)) in collectives(ins, op).into_iter().enumerate() {
        assert_eq!(ar, want, "all_reduce {op} rank {r}");
        assert_eq!(
            rs,
            &want[r * per..(r + 1) * per],
            "reduce_scatter {op} rank {r}"
        );
    }
}

/// f64 inputs from raw bits, NaN and infinity replaced, so any finite value occurs.
fn finite(bits: u64) -> f64 {
    let x = f64::from_bits(bits);
    if x.is_finite() {
        x
    } else {
        f64::from_bits(bits & !(1 << 62))
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn i64_collectives_match_a_wrapping_loop(n in 1usize..=6, per in 0usize..12,
            op in prop_oneof![Just(0usize), Just(2), Just(3)],
            raw in prop::collection::vec(any::<i64>(), 72)) {
        let ins: Vec<Vec<i64>> = (0..n).map(|r| raw.iter().cycle().skip(r * 5).take(n * per).copied().collect()).collect();
        check(&ins, OPS[op], &naive_i64(&ins, OPS[op]));
    }

    #[test]
    fn i32_collectives_match_a_wrapping_loop(n in 1usize..=6, per in 0usize..12,
            op in prop_oneof![Just(0usize), Just(2), Just(3)],
            raw in prop::collection::vec(any::<i32>(), 72)) {
        let ins: Vec<Vec<i32>> = (0..n).map(|r| raw.iter().cycle().skip(r * 5).take(n * per).copied().collect()).collect();
        check(&ins, OPS[op], &naive_i32(&ins, OPS[op]));
    }

    #[test]
    fn f64_collectives_match_a_rank_order_loop(n in 1usize..=6, per in 0usize..12, op in 0usize..4,
            raw in prop::collection::vec(any::<u64>(), 72)) {
        let ins: Vec<Vec<f64>> = (0..n)
            .map(|r| raw.iter().cycle().skip(r * 5).take(n * per).map(|&b| finite(b)).collect())
            .collect();
        let want: Vec<u64> = naive_f64(&ins, OPS[op]);
        let per = want.len() / n;
        for (r, (ar, rs)) in collectives(&ins, OPS[op]).into_iter().enumerate() {
            let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            prop_assert_eq!(bits(&ar), want.clone(), "all_reduce rank {}", r);
            prop_assert_eq!(bits(&rs), want[r * per..(r + 1) * per].to_vec(), "reduce_scatter rank {}", r);
        }
    }
}

#[test]
fn integer_avg_is_refused_on_every_rank_and_the_group_goes_on() {
    let outcomes = run(local::create(3).unwrap(), |c| {
        let mut x = vec![c.rank() as i64; 6];
        let avg = c.all_reduce_in_place(&mut x, ReduceOp::Avg);
        let mut y = vec![1i32; 3];
        let rs = c.reduce_scatter_in_place(&mut y, ReduceOp::Avg);
        c.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap();
        (avg, rs, x)
    });
    for (avg, rs, x) in outcomes {
        let msg = avg.as_ref().map_err(ToString::to_string).unwrap_err();
        assert!(
            matches!(avg, Err(CommError::UnsupportedReduction { .. })),
            "{msg}"
        );
        assert!(msg.contains("avg is not defined on int64"), "{msg}");
        assert!(matches!(rs, Err(CommError::UnsupportedReduction { .. })));
        assert_eq!(x, vec![3i64; 6], "0 + 1 + 2 after the refusals");
    }
}

#[test]
fn async_integer_avg_is_refused_too() {
    let outcomes = run(local::create(2).unwrap(), |c| {
        let work = c.all_reduce_async::<i32, _>(vec![1i32; 4], ReduceOp::Avg);
        let refused = work.wait().map(drop);
        let sum = c
            .all_reduce_async::<i32, _>(vec![1i32; 4], ReduceOp::Sum)
            .wait();
        (refused, sum)
    });
    for (refused, sum) in outcomes {
        assert!(
            matches!(refused, Err(CommError::UnsupportedReduction { .. })),
            "{refused:?}"
        );
        assert_eq!(sum.unwrap(), vec![2i32; 4]);
    }
}
