//! Sub-communicators: a 2-D grid of data-parallel x tensor-parallel groups.

mod common;

use common::run;
use zero_comm::{local, ReduceOp};

#[test]
fn grid_of_dp_by_tp_groups() {
    let (dp, tp) = (3, 2);
    let out = run(local::create(dp * tp).unwrap(), |c| {
        let r = c.rank();
        let tp_group = c.split((r / tp) as u32, (r % tp) as u32).unwrap();
        let dp_group = c.split((r % tp) as u32, (r / tp) as u32).unwrap();
        assert_eq!((tp_group.size(), tp_group.rank()), (tp, r % tp));
        assert_eq!((dp_group.size(), dp_group.rank()), (dp, r / tp));
        let mut x = vec![r as f32];
        tp_group.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap();
        let mut y = vec![r as f32];
        dp_group.all_reduce_in_place(&mut y, ReduceOp::Sum).unwrap();
        // The parent still works after splitting.
        c.barrier().unwrap();
        (x[0], y[0])
    });
    for (r, (x, y)) in out.into_iter().enumerate() {
        let row = r / tp * tp;
        assert_eq!(x, (row + row + 1) as f32, "tp sum at rank {r}");
        let col = r % tp;
        assert_eq!(
            y,
            (col + (col + tp) + (col + 2 * tp)) as f32,
            "dp sum at rank {r}"
        );
    }
}

#[test]
fn key_orders_ranks_within_a_color() {
    let ranks = run(local::create(4).unwrap(), |c| {
        // One color, keys reversed: new rank = 3 - old rank.
        c.split(0, (10 - c.rank()) as u32).unwrap().rank()
    });
    assert_eq!(ranks, vec![3, 2, 1, 0]);
}

mod reference {
    use super::common::{data, reference, run};
    use proptest::prelude::*;
    use zero_comm::{local, ReduceOp};

    proptest! {
        #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

        /// Random colors and keys: each sub-group's all-reduce equals the reference over
        /// exactly its members, and ranks follow (key, old rank).
        #[test]
        fn sub_group_all_reduce_matches_reference(colors in prop::collection::vec(0u32..3, 1..=8),
                keys in prop::collection::vec(0u32..4, 8), len in 0usize..20, seed: u64) {
            let n = colors.len();
            let inputs: Vec<Vec<f32>> = (0..n).map(|r| data(seed, r, len)).collect();
            let out = run(local::create(n).unwrap(), |c| {
                let r = c.rank();
                let sub = c.split(colors[r], keys[r]).unwrap();
                let mut x = inputs[r].clone();
                sub.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap();
                (sub.rank(), sub.size(), x)
            });
            for (r, (sub_rank, sub_size, x)) in out.iter().enumerate() {
                let mut members: Vec<(u32, usize)> =
                    (0..n).filter(|&k| colors[k] == colors[r]).map(|k| (keys[k], k)).collect();
                members.sort_unstable();
                prop_assert_eq!(*sub_size, members.len());
                prop_assert_eq!(members[*sub_rank].1, r);
                // Reduction order is the sub-group's rank order.
                let ordered: Vec<Vec<f32>> = members.iter().map(|&(_, k)| inputs[k].clone()).collect();
                prop_assert_eq!(x, &reference(&ordered, ReduceOp::Sum));
            }
        }
    }
}
