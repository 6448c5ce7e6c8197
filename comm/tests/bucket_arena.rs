//! A bucketer whose two buffers are blocks of the rank's arena, lent for its lifetime: the
//! bucket memory is then counted by the arena like every other buffer.

use zero_alloc::Arena;
use zero_comm::{local, BucketKind, Bucketer, ReduceOp};

#[test]
fn arena_buckets_reduce_scatter_like_vec_buckets_and_go_back_to_the_arena() {
    let comms = local::create(2).unwrap();
    std::thread::scope(|s| {
        for comm in comms {
            s.spawn(move || {
                let r = comm.rank() as f32;
                // Three tensors of 6, 10 and 2 elements per rank's shard, buckets of 8.
                let tensors: Vec<Vec<f32>> = [12usize, 20, 4]
                    .iter()
                    .map(|&n| (0..n).map(|i| i as f32 + 100.0 * r).collect())
                    .collect();
                let mut arena = Arena::host(1 << 16).unwrap();
                let blocks = [
                    arena.alloc_elems::<f32>(16).unwrap(),
                    arena.alloc_elems::<f32>(16).unwrap(),
                ];
                let before = arena.stats().allocated;
                let lent = blocks.map(|h| arena.lend::<f32>(h).unwrap());
                let mut from_arena: Vec<Vec<f32>> =
                    tensors.iter().map(|t| vec![0.0; t.len() / 2]).collect();
                let mut b =
                    Bucketer::with_buffers(&comm, BucketKind::ReduceScatter(ReduceOp::Sum), lent)
                        .unwrap();
                for (t, out) in tensors.iter().zip(from_arena.iter_mut()) {
                    b.push(t, out).unwrap();
                }
                let launched = b.launched();
                for lent in b.into_buffers().unwrap() {
                    arena.take_back(lent).unwrap();
                }
                // The same stream through Vec buckets of the same size.
                let mut from_vecs: Vec<Vec<f32>> =
                    tensors.iter().map(|t| vec![0.0; t.len() / 2]).collect();
                let mut v =
                    Bucketer::new(&comm, BucketKind::ReduceScatter(ReduceOp::Sum), 16 * 4).unwrap();
                for (t, out) in tensors.iter().zip(from_vecs.iter_mut()) {
                    v.push(t, out).unwrap();
                }
                v.flush().unwrap();
                assert_eq!(from_arena, from_vecs);
                // Shard 0 of tensor 0 is elements 0..6 summed over ranks 0 and 1.
                if comm.rank() == 0 {
                    assert_eq!(
                        from_arena[0],
                        vec![100.0, 102.0, 104.0, 106.0, 108.0, 110.0]
                    );
                }
                assert!(launched >= 1, "a full bucket launches before the flush");
                assert_eq!(arena.stats().allocated, before);
                for h in blocks {
                    arena.free(h).unwrap(); // unpinned again
                }
            });
        }
    });
}

#[test]
fn buffers_of_different_lengths_are_refused() {
    let comms = local::create(1).unwrap();
    let comm = &comms[0];
    let err = Bucketer::<f32, Vec<f32>>::with_buffers(
        comm,
        BucketKind::AllReduce(ReduceOp::Sum),
        [vec![0.0; 8], vec![0.0; 4]],
    )
    .unwrap_err();
    assert!(err.to_string().contains("8 and 4"), "{err}");
}
