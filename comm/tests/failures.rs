//! Safety: timeouts name the op and the missing ranks, dead ranks fail their peers promptly,
//! mismatches are reported on every rank, bad arguments are errors.

mod common;

use std::time::Duration;

use common::run;
use zero_comm::{local, BreakCause, CommError, Config, OpKind, ReduceOp};

fn short() -> Config {
    Config::with_timeout(Duration::from_millis(200))
}

#[test]
fn timeout_names_op_seq_bytes_and_missing_ranks() {
    let errs = run(local::create_with(3, short()).unwrap(), |c| {
        c.barrier().unwrap(); // seq 0
        if c.rank() == 2 {
            // Rank 2 skips the all-reduce but keeps its communicator past the timeout.
            std::thread::sleep(Duration::from_millis(1000));
            return None;
        }
        let mut x = vec![1.0f32; 10];
        let e = c.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap_err();
        Some(e)
    });
    let e = errs[0].as_ref().unwrap();
    let timed_out = errs
        .iter()
        .flatten()
        .any(|e| matches!(e, CommError::Timeout { .. }));
    assert!(timed_out, "{errs:?}");
    for e in errs.iter().flatten() {
        match e {
            CommError::Timeout {
                op,
                seq,
                bytes,
                missing,
                ..
            } => {
                assert_eq!((*op, *seq, *bytes), (OpKind::AllReduce, 1, 40));
                assert_eq!(missing, &vec![2]);
            }
            CommError::Broken { cause, .. } => {
                assert!(
                    matches!(cause, BreakCause::TimedOut { seq: 1, .. }),
                    "{cause}"
                );
            }
            other => panic!("unexpected {other}"),
        }
    }
    // The message carries the history of the last ops.
    let msg = e.to_string();
    assert!(msg.contains("#0 barrier"), "{msg}");
}

#[test]
fn panicking_rank_fails_peers_promptly() {
    // Default 10-minute timeout: the error must come from the panic (cause `Panicked`), not
    // from a timeout.
    let comms = local::create(3).unwrap();
    let results: Vec<std::thread::Result<Result<(), CommError>>> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .into_iter()
            .map(|c| {
                s.spawn(move || {
                    if c.rank() == 1 {
                        panic!("rank 1 dies in its own code");
                    }
                    let mut x = vec![0f32; 4];
                    c.all_reduce_in_place(&mut x, ReduceOp::Sum)?;
                    c.barrier()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join()).collect()
    });
    assert!(results[1].is_err());
    for r in [0, 2] {
        match &results[r] {
            Ok(Err(CommError::Broken {
                cause: BreakCause::Panicked { rank: 1 },
                ..
            })) => {}
            other => panic!("rank {r}: {other:?}"),
        }
    }
}

#[test]
fn rank_returning_early_fails_peers_future_ops() {
    let errs = run(local::create(2).unwrap(), |c| {
        if c.rank() == 0 {
            return None; // drops its communicator without a collective
        }
        Some(c.barrier().unwrap_err())
    });
    assert!(matches!(
        errs[1],
        Some(CommError::Broken {
            cause: BreakCause::Left { rank: 0 },
            ..
        })
    ));
}

#[test]
fn mismatch_is_reported_on_every_rank() {
    let errs = run(local::create(3).unwrap(), |c| {
        let mut x = vec![0f32; if c.rank() == 2 { 6 } else { 4 }];
        let e = c.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap_err();
        // The group is broken afterwards.
        assert!(matches!(c.barrier(), Err(CommError::Broken { .. })));
        e
    });
    for (r, e) in errs.iter().enumerate() {
        match e {
            CommError::Mismatch {
                seq: 0,
                field: "count",
                rank,
                ..
            } => assert_eq!(*rank, r),
            other => panic!("rank {r}: {other}"),
        }
    }
    assert!(
        errs[0].to_string().contains("rank 2 has count = 6"),
        "{}",
        errs[0]
    );
}

#[test]
fn different_ops_at_same_seq_are_a_mismatch() {
    let errs = run(local::create(2).unwrap(), |c| {
        let mut x = vec![0f32; 4];
        if c.rank() == 0 {
            c.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap_err()
        } else {
            c.broadcast_in_place(&mut x, 0).unwrap_err()
        }
    });
    for e in errs {
        assert!(matches!(e, CommError::Mismatch { field: "op", .. }), "{e}");
    }
}

#[test]
fn bad_lengths_and_roots_are_errors() {
    let comms = local::create(1).unwrap();
    let c = &comms[0];
    let mut out = vec![0f32; 3];
    assert!(matches!(
        c.all_reduce(&[1.0; 4], &mut out, ReduceOp::Sum),
        Err(CommError::Length { .. })
    ));
    assert!(matches!(
        c.broadcast_in_place(&mut out, 1),
        Err(CommError::Root {
            root: 1,
            size: 1,
            ..
        })
    ));
    let comms = local::create(2).unwrap();
    let e = comms[0]
        .reduce_scatter_in_place(&mut [0f32; 3], ReduceOp::Sum)
        .unwrap_err();
    assert!(
        matches!(
            e,
            CommError::Length {
                expected: 4,
                got: 3,
                ..
            }
        ),
        "{e}"
    );
    assert!(local::create(0).is_err());
}
