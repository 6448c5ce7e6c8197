use super::*;
use crate::reduce_op::ReduceOp;

const SUM: ReduceOp = ReduceOp::Sum;

/// The highest element index NCCL touches through `side` when it reads or writes `n`.
fn end(side: Side, n: usize) -> Option<(bool, usize)> {
    match side {
        Side::Send(o) => Some((true, o + n)),
        Side::Recv(o) => Some((false, o + n)),
        Side::Null => None,
    }
}

#[test]
fn in_place_layouts_are_nccls() {
    let rs = plan(Collective::ReduceScatter(SUM), 2, 4, true, None, Some(8)).unwrap();
    assert_eq!(
        rs,
        Launch {
            count: 2,
            whole: 8,
            send: Side::Recv(0),
            recv: Side::Recv(4)
        }
    );
    let ag = plan(Collective::AllGather, 3, 4, true, None, Some(8)).unwrap();
    assert_eq!(
        ag,
        Launch {
            count: 2,
            whole: 8,
            send: Side::Recv(6),
            recv: Side::Recv(0)
        }
    );
    let ar = plan(Collective::AllReduce(SUM), 1, 4, true, None, Some(5)).unwrap();
    assert_eq!(
        ar,
        Launch {
            count: 5,
            whole: 5,
            send: Side::Recv(0),
            recv: Side::Recv(0)
        }
    );
}

#[test]
fn out_of_place_counts_are_nccls() {
    // reduce_scatter and all_gather take the per-rank count; the descriptor the whole array.
    let rs = plan(
        Collective::ReduceScatter(SUM),
        0,
        3,
        false,
        Some(9),
        Some(3),
    )
    .unwrap();
    assert_eq!((rs.count, rs.whole), (3, 9));
    let ag = plan(Collective::AllGather, 0, 3, false, Some(3), Some(9)).unwrap();
    assert_eq!((ag.count, ag.whole), (3, 9));
}

#[test]
fn ignored_buffers_may_be_absent_off_the_root_only() {
    let b = plan(Collective::Broadcast(1), 0, 2, false, None, Some(4)).unwrap();
    assert_eq!((b.send, b.recv), (Side::Null, Side::Recv(0)));
    assert!(plan(Collective::Broadcast(1), 1, 2, false, None, Some(4)).is_err());
    let r = plan(Collective::Reduce(SUM, 0), 1, 2, false, Some(4), None).unwrap();
    assert_eq!((r.send, r.recv), (Side::Send(0), Side::Null));
    assert!(plan(Collective::Reduce(SUM, 0), 0, 2, false, Some(4), None).is_err());
}

#[test]
fn wrong_lengths_and_roots_are_refused() {
    let bad = [
        plan(Collective::AllReduce(SUM), 0, 2, false, Some(4), Some(3)),
        plan(
            Collective::ReduceScatter(SUM),
            0,
            2,
            false,
            Some(5),
            Some(2),
        ),
        plan(Collective::AllGather, 0, 2, false, Some(2), Some(5)),
        plan(Collective::ReduceScatter(SUM), 0, 4, true, None, Some(6)),
        plan(Collective::AllGather, 0, 4, true, None, Some(7)),
        plan(Collective::Broadcast(0), 0, 2, false, Some(3), Some(4)),
        plan(Collective::Reduce(SUM, 0), 0, 2, false, Some(4), Some(3)),
    ];
    for r in bad {
        assert!(matches!(r, Err(CommError::Length { .. })), "{r:?}");
    }
    let root = plan(Collective::Broadcast(2), 0, 2, true, None, Some(4));
    assert!(
        matches!(
            root,
            Err(CommError::Root {
                root: 2,
                size: 2,
                ..
            })
        ),
        "{root:?}"
    );
    let overflow = plan(
        Collective::AllGather,
        0,
        2,
        false,
        Some(usize::MAX),
        Some(1),
    );
    assert!(
        matches!(overflow, Err(CommError::InvalidArgument { .. })),
        "{overflow:?}"
    );
}

/// The property S3 rests on: every accepted plan keeps both pointers inside their buffers.
#[test]
fn every_accepted_plan_stays_inside_the_buffers() {
    let calls = [
        Collective::AllReduce(SUM),
        Collective::ReduceScatter(SUM),
        Collective::AllGather,
        Collective::Broadcast(1),
        Collective::Reduce(SUM, 1),
    ];
    let lens = [None, Some(0), Some(1), Some(3), Some(4), Some(6), Some(12)];
    for call in calls {
        for size in 2..=4 {
            for rank in 0..size {
                for in_place in [false, true] {
                    for s in lens {
                        for r in lens {
                            let send = if in_place { None } else { s };
                            let Ok(p) = plan(call, rank, size, in_place, send, r) else {
                                continue;
                            };
                            // NCCL reads `count` (x size for reduce-scatter) and writes
                            // `count` (x size for all-gather) elements.
                            let (reads, writes) = match call {
                                Collective::ReduceScatter(_) => (p.count * size, p.count),
                                Collective::AllGather => (p.count, p.count * size),
                                _ => (p.count, p.count),
                            };
                            for (side, n) in [(p.send, reads), (p.recv, writes)] {
                                let Some((is_send, hi)) = end(side, n) else {
                                    continue;
                                };
                                let len = if is_send { send } else { r };
                                assert!(
                                    hi <= len.unwrap_or(0),
                                    "{call:?} rank {rank}/{size} in_place {in_place} {s:?} {r:?}: {p:?}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}
