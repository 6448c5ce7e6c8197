//! Arena views from zero-alloc plug straight into the collectives: ZeRO's flat gradient
//! buffer reduce-scattered into a shard and all-gathered back, all in one arena per rank.

mod common;

use common::run;
use half::bf16;
use zero_alloc::Arena;
use zero_comm::{local, ReduceOp};

#[test]
fn reduce_scatter_and_all_gather_over_arena_views() {
    let (n, per) = (4, 1000); // unit of 4000 elements, padded to a multiple of 4 ranks
    let out = run(local::create(n).unwrap(), |c| {
        let mut arena = Arena::host(1 << 20).unwrap();
        let grads = arena.alloc_elems::<bf16>(n * per).unwrap();
        let shard = arena.alloc_elems::<bf16>(per).unwrap();
        let [g, s] = arena.slices_mut::<bf16, 2>([grads, shard]).unwrap();
        g.iter_mut()
            .enumerate()
            .for_each(|(i, x)| *x = bf16::from_f32((c.rank() + i % 3) as f32));
        c.reduce_scatter(g, s, ReduceOp::Sum).unwrap();
        c.all_gather(s, g).unwrap();
        arena
            .slice::<bf16>(grads)
            .unwrap()
            .iter()
            .map(|x| x.to_f32())
            .collect::<Vec<f32>>()
    });
    // Element i: sum over ranks r of (r + i % 3) = 6 + 4 (i % 3).
    let want: Vec<f32> = (0..n * per).map(|i| 6.0 + 4.0 * (i % 3) as f32).collect();
    for got in out {
        assert_eq!(got, want);
    }
}

#[test]
fn scoped_async_ops_on_arena_views_complete_before_the_scope_ends() {
    let n = 3;
    let out = run(local::create(n).unwrap(), |c| {
        let mut arena = Arena::host(1 << 20).unwrap();
        let a = arena.alloc_elems::<f32>(30).unwrap();
        let b = arena.alloc_elems::<f32>(30).unwrap();
        let [va, vb] = arena.slices_mut::<f32, 2>([a, b]).unwrap();
        va.fill(c.rank() as f32);
        vb.fill(1.0);
        c.scope(|s| {
            let wa = s.reduce_scatter(va, ReduceOp::Sum);
            // A forgotten handle: the scope still waits for its collective.
            std::mem::forget(s.all_reduce(vb, ReduceOp::Sum));
            let va = wa.wait().unwrap();
            let r = c.rank();
            assert_eq!(&va[r * 10..(r + 1) * 10], &[3.0; 10]); // 0 + 1 + 2
        });
        arena.slice::<f32>(b).unwrap().to_vec()
    });
    for vb in out {
        assert_eq!(vb, vec![3.0; 30]);
    }
}
