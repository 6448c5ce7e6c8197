//! Tensors reduced bucket by bucket through `ShardBuckets` against the naive reference (every
//! rank's element summed in f64) and against one direct collective on the whole tensor.

mod common;

use common::{data, reference, run};
use proptest::prelude::*;
use zero_comm::{local, ReduceOp, ShardBuckets};

/// This rank's result of reducing its whole tensor bucket by bucket: its own shard
/// (reduce-scatter) or the whole tensor (all-reduce).
fn bucketed(
    c: &zero_comm::Communicator,
    whole: &[f32],
    shard_len: usize,
    bucket_elems: usize,
    all: bool,
) -> Vec<f32> {
    let (n, r) = (c.size(), c.rank());
    let layout = ShardBuckets::new(n, shard_len, bucket_elems).unwrap();
    let mut out = vec![f32::NAN; if all { n * shard_len } else { shard_len }];
    for bucket in layout.buckets() {
        assert!(layout.bucket_elems(bucket) <= bucket_elems.max(n));
        let mut staged = vec![0f32; layout.bucket_elems(bucket)];
        layout.pack(bucket, whole, &mut staged, |s, d| d.copy_from_slice(s));
        if all {
            c.all_reduce_in_place(&mut staged, ReduceOp::Sum).unwrap();
            for j in 0..n {
                out[layout.source(bucket, j)].copy_from_slice(&staged[layout.segment(bucket, j)]);
            }
        } else {
            c.reduce_scatter_in_place(&mut staged, ReduceOp::Sum)
                .unwrap();
            let own = layout.segment(bucket, r);
            out[bucket.offset..bucket.offset + bucket.len].copy_from_slice(&staged[own]);
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn bucketed_reductions_equal_the_naive_sum_and_the_direct_collective(
            n in 1usize..=4, shard_len in 0usize..40, bucket_elems in 1usize..50, all: bool, seed: u64) {
        let inputs: Vec<Vec<f32>> = (0..n).map(|r| data(seed, r, n * shard_len)).collect();
        let naive = reference(&inputs, ReduceOp::Sum);
        let ok = run(local::create(n).unwrap(), |c| {
            let r = c.rank();
            let got = bucketed(&c, &inputs[r], shard_len, bucket_elems, all);
            let mut direct = vec![0f32; got.len()];
            let want: &[f32] = if all {
                c.all_reduce(&inputs[r], &mut direct, ReduceOp::Sum).unwrap();
                &naive
            } else {
                c.reduce_scatter(&inputs[r], &mut direct, ReduceOp::Sum).unwrap();
                &naive[r * shard_len..(r + 1) * shard_len]
            };
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            bits(&got) == bits(want) && bits(&got) == bits(&direct)
        });
        prop_assert!(ok.iter().all(|&b| b));
    }

    /// The buckets tile every shard exactly once, in order, none larger than asked.
    #[test]
    fn buckets_tile_each_shard(n in 1usize..=8, shard_len in 0usize..100, bucket_elems in 1usize..64) {
        let layout = ShardBuckets::new(n, shard_len, bucket_elems).unwrap();
        let mut next = 0;
        for b in layout.buckets() {
            prop_assert_eq!(b.offset, next);
            prop_assert!(b.len >= 1);
            prop_assert!(n * b.len <= bucket_elems.max(n));
            prop_assert!(n * b.len <= layout.max_bucket_elems());
            next += b.len;
        }
        prop_assert_eq!(next, shard_len);
    }
}

#[test]
fn a_world_of_no_ranks_is_an_error() {
    assert!(ShardBuckets::new(0, 8, 8).is_err());
}
