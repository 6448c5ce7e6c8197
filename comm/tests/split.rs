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
