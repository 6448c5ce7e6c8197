//! Non-blocking collectives: many in flight, issue order, buffers returned, stats.

mod common;

use common::run;
use zero_comm::{local, Collective, ReduceOp};

#[test]
fn many_ops_in_flight_complete_in_issue_order() {
    let n = 4;
    let results = run(local::create(n).unwrap(), |c| {
        let r = c.rank() as f32;
        // Each op i: all-reduce of [r + i; 8]; sum over ranks = 6 + 4i.
        let works: Vec<_> = (0..16)
            .map(|i| c.all_reduce_async(vec![r + i as f32; 8], ReduceOp::Sum))
            .collect();
        // A blocking op issued after them waits for them, then runs.
        c.barrier().unwrap();
        assert!(works.iter().all(|w| w.is_done()));
        works
            .into_iter()
            .map(|w| w.wait().unwrap()[0])
            .collect::<Vec<f32>>()
    });
    let want: Vec<f32> = (0..16).map(|i| 6.0 + 4.0 * i as f32).collect();
    for got in results {
        assert_eq!(got, want);
    }
}

#[test]
fn async_forms_match_blocking_forms() {
    run(local::create(3).unwrap(), |c| {
        let r = c.rank();
        let base: Vec<f32> = (0..6).map(|i| (i * 3 + r) as f32).collect();
        let rs = c.reduce_scatter_async(base.clone(), ReduceOp::Max);
        let ag = c.all_gather_async({
            let mut v = vec![0f32; 6];
            v[2 * r..2 * r + 2].fill(r as f32);
            v
        });
        let bc = c.broadcast_async(vec![r as f32; 2], 1);
        let rd = c.reduce_async(vec![1f32; 2], ReduceOp::Sum, 0);
        let oop = c.collective_async(
            Collective::AllReduce(ReduceOp::Min),
            Some(base.clone()),
            vec![0f32; 6],
        );
        let bar = c.barrier_async();

        let rs = rs.wait().unwrap();
        let mut want = base.clone();
        c.reduce_scatter_in_place(&mut want, ReduceOp::Max).unwrap();
        assert_eq!(rs[2 * r..2 * r + 2], want[2 * r..2 * r + 2]);
        assert_eq!(ag.wait().unwrap(), vec![0., 0., 1., 1., 2., 2.]);
        assert_eq!(bc.wait().unwrap(), vec![1.0; 2]);
        let rd = rd.wait().unwrap();
        if r == 0 {
            assert_eq!(rd, vec![3.0; 2]);
        }
        let (send, recv) = oop.wait().unwrap();
        assert_eq!(send.unwrap(), base);
        assert_eq!(recv, (0..6).map(|i| (i * 3) as f32).collect::<Vec<_>>());
        bar.wait().unwrap();
    });
}

#[test]
fn dropped_handle_still_completes_for_peers() {
    run(local::create(2).unwrap(), |c| {
        drop(c.all_reduce_async(vec![1f32; 4], ReduceOp::Sum));
        let mut x = vec![1f32; 2];
        c.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap();
        assert_eq!(x, vec![2.0; 2]);
    });
}

#[test]
fn stats_count_ring_bytes_and_history() {
    let stats = run(local::create(4).unwrap(), |c| {
        let mut x = vec![0f32; 64]; // 256 bytes
        c.reduce_scatter_in_place(&mut x, ReduceOp::Sum).unwrap();
        c.all_gather_in_place(&mut x).unwrap();
        c.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap();
        (c.stats(), c.history())
    });
    for (s, h) in stats {
        assert_eq!(s.ops, 3);
        // (N-1)/N * 256 = 192 for RS and AG, twice that for AR.
        assert_eq!(s.bytes_sent, 192 + 192 + 384);
        assert_eq!(s.bytes_received, s.bytes_sent);
        assert_eq!(h.records.len(), 3);
        assert_eq!(h.records[2].desc.seq, 2);
    }
}

/// A buffer whose `as_mut` panics: the handle reports the loss, and the communicator goes on.
struct Bomb;
impl AsMut<[f32]> for Bomb {
    fn as_mut(&mut self) -> &mut [f32] {
        panic!("user buffer panicked");
    }
}

#[test]
fn panicking_buffer_fails_its_handle_without_hanging() {
    let comms = local::create(1).unwrap();
    let c = &comms[0];
    let w = c.all_reduce_async::<f32, _>(Bomb, ReduceOp::Sum);
    assert!(matches!(
        w.wait(),
        Err(zero_comm::CommError::ProgressLost { .. })
    ));
    let mut x = vec![1f32; 3];
    c.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap();
    assert_eq!(x, vec![1.0; 3]);
}
