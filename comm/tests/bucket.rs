//! The bucketer against direct collectives, for random tensor streams.

mod common;

use common::{data, run};
use proptest::prelude::*;
use zero_comm::{local, BucketKind, Bucketer, ReduceOp};

fn stream(seed: u64, rank: usize, lens: &[usize]) -> Vec<Vec<f32>> {
    lens.iter()
        .enumerate()
        .map(|(t, &l)| data(seed + t as u64, rank, l))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn bucketed_results_equal_direct_collectives(n in 1usize..=4, shards in prop::collection::vec(0usize..12, 0..8),
            bucket_elems in 1usize..20, kind in 0usize..3, in_place: bool, seed: u64) {
        let kind = [BucketKind::AllReduce(ReduceOp::Sum), BucketKind::ReduceScatter(ReduceOp::Sum), BucketKind::AllGather][kind];
        let ok = run(local::create(n).unwrap(), |c| {
            let r = c.rank();
            let (in_lens, out_lens): (Vec<usize>, Vec<usize>) = match kind {
                BucketKind::AllReduce(_) => (shards.clone(), shards.clone()),
                BucketKind::ReduceScatter(_) => (shards.iter().map(|s| s * n).collect(), shards.clone()),
                BucketKind::AllGather => (shards.clone(), shards.iter().map(|s| s * n).collect()),
            };
            let inputs = stream(seed, r, &in_lens);
            // Direct: one collective per tensor.
            let want: Vec<Vec<f32>> = inputs.iter().zip(&out_lens).map(|(x, &ol)| {
                let mut out = vec![0f32; ol];
                match kind {
                    BucketKind::AllReduce(op) => c.all_reduce(x, &mut out, op).unwrap(),
                    BucketKind::ReduceScatter(op) => c.reduce_scatter(x, &mut out, op).unwrap(),
                    BucketKind::AllGather => c.all_gather(x, &mut out).unwrap(),
                }
                out
            }).collect();
            // Bucketed.
            let bytes = bucket_elems * 4 * if matches!(kind, BucketKind::AllReduce(_)) { 1 } else { n };
            let mut got: Vec<Vec<f32>> = if in_place {
                inputs.iter().map(|x| match kind {
                    BucketKind::AllGather => {
                        let mut v = vec![0f32; x.len() * n];
                        v[r * x.len()..(r + 1) * x.len()].copy_from_slice(x);
                        v
                    }
                    _ => x.clone(),
                }).collect()
            } else {
                out_lens.iter().map(|&l| vec![0f32; l]).collect()
            };
            let mut b = Bucketer::new(&c, kind, bytes).unwrap();
            let mem = b.memory_bytes();
            for (i, out) in got.iter_mut().enumerate() {
                if in_place { b.push_in_place(out).unwrap() } else { b.push(&inputs[i], out).unwrap() }
            }
            b.flush().unwrap();
            assert_eq!(b.memory_bytes(), mem);
            drop(b);
            got.iter().zip(&want).all(|(g, w)| match (kind, in_place) {
                (BucketKind::ReduceScatter(_), true) => {
                    let s = w.len();
                    g[r * s..(r + 1) * s] == w[..]
                }
                _ => g == w,
            })
        });
        prop_assert!(ok.iter().all(|&b| b));
    }
}

#[test]
fn too_small_bucket_is_an_error() {
    let comms = local::create(4).unwrap();
    assert!(Bucketer::<f32>::new(&comms[0], BucketKind::ReduceScatter(ReduceOp::Sum), 8).is_err());
}
