//! Failures on the TCP backend: a rank that leaves or stalls, ranks that call different
//! collectives, nobody listening, and peers that send garbage. Each must be an error naming
//! the rank and the collective on the survivors, never a hang or a panic.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Barrier;
use std::time::Duration;

use zero_comm::bootstrap::LaunchEnv;
use zero_comm::{tcp, BreakCause, CommError, Communicator, Config, OpKind, ReduceOp};

fn config(timeout_ms: u64) -> Config {
    Config::with_timeout(Duration::from_millis(timeout_ms))
}

/// A listener on a free loopback port, and its address.
fn listen() -> (tcp::Listener, String) {
    let listener = tcp::Listener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("address").to_string();
    (listener, addr)
}

/// A TCP group of `n` over loopback.
fn group(n: usize, config: Config) -> Vec<Communicator> {
    let (listener, addr) = listen();
    std::thread::scope(|s| {
        let joins: Vec<_> = (1..n)
            .map(|r| {
                let addr = addr.clone();
                s.spawn(move || tcp::join(&addr, r, n, config))
            })
            .collect();
        let mut comms = vec![listener.accept_group(n, config).expect("rank 0")];
        for j in joins {
            comms.push(j.join().expect("join thread").expect("join"));
        }
        comms
    })
}

fn on_ranks<I: Send, R: Send>(items: Vec<I>, f: impl Fn(I) -> R + Sync) -> Vec<R> {
    let f = &f;
    std::thread::scope(|s| {
        let hs: Vec<_> = items.into_iter().map(|c| s.spawn(move || f(c))).collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect()
    })
}

/// The hello a rank sends when it joins (see `tcp/connect.rs`).
fn hello(rank: u32, size: u32) -> Vec<u8> {
    let mut h = b"ZTCH".to_vec();
    h.extend_from_slice(&1u16.to_le_bytes());
    h.extend_from_slice(&rank.to_le_bytes());
    h.extend_from_slice(&size.to_le_bytes());
    h
}

fn all_reduce(c: &Communicator) -> Result<(), CommError> {
    let mut x = vec![1.0f32; 10];
    c.all_reduce_in_place(&mut x, ReduceOp::Sum)
}

fn left_rank(e: &CommError) -> Option<usize> {
    match e {
        CommError::Broken {
            op: OpKind::AllReduce,
            cause: BreakCause::Left { rank },
            ..
        } => Some(*rank),
        _ => None,
    }
}

#[test]
fn a_rank_that_drops_its_communicator_fails_its_peers() {
    // A long timeout: the error must come from the closed connection, not from waiting.
    let errs = on_ranks(group(3, config(60_000)), |c| {
        if c.rank() == 2 {
            drop(c);
            return None;
        }
        Some(all_reduce(&c).unwrap_err())
    });
    for e in errs.iter().flatten() {
        assert_eq!(left_rank(e), Some(2), "{e}");
    }
}

#[test]
fn a_rank_that_dies_mid_frame_fails_its_peers() {
    // Rank 1 is a raw socket: a valid hello and header, half the payload, then it closes.
    let (listener, addr) = listen();
    let fake = std::thread::spawn({
        let addr = addr.clone();
        move || {
            let mut s = TcpStream::connect(&addr).expect("connect");
            s.write_all(&hello(1, 3)).expect("hello");
            let mut welcome = [0u8; 10];
            s.read_exact(&mut welcome).expect("welcome");
            let mut header = b"ZTCF".to_vec();
            header.extend_from_slice(&0u64.to_le_bytes()); // seq
            header.extend_from_slice(&[1, 0, 1, 1]); // all_reduce, ok, f32, sum
            header.extend_from_slice(&u32::MAX.to_le_bytes()); // no root
            header.extend_from_slice(&10u64.to_le_bytes()); // count
            header.extend_from_slice(&40u64.to_le_bytes()); // payload bytes
            s.write_all(&header).expect("header");
            s.write_all(&[0u8; 20]).expect("half the payload");
        }
    });
    let rank2 = std::thread::spawn(move || {
        let c = tcp::join(&addr, 2, 3, config(60_000)).expect("join");
        all_reduce(&c).unwrap_err()
    });
    let rank0 = listener.accept_group(3, config(60_000)).expect("rank 0");
    let e0 = all_reduce(&rank0).unwrap_err();
    fake.join().expect("fake rank");
    let e2 = rank2.join().expect("rank 2");
    assert_eq!(left_rank(&e0), Some(1), "{e0}");
    assert_eq!(left_rank(&e2), Some(1), "{e2}");
}

#[test]
fn a_stalled_rank_times_out_its_peers_and_is_named() {
    let done = Barrier::new(3);
    let errs = on_ranks(group(3, config(300)), |c| {
        let e = (c.rank() != 2).then(|| all_reduce(&c).unwrap_err());
        // Rank 2 keeps its communicator until the others have failed.
        done.wait();
        e
    });
    match &errs[0] {
        Some(CommError::Timeout {
            op: OpKind::AllReduce,
            seq: 0,
            missing,
            ..
        }) => {
            assert_eq!(missing, &vec![2]);
        }
        other => panic!("rank 0: {other:?}"),
    }
    // Rank 1 either gave up itself or heard from rank 0 that it did.
    match &errs[1] {
        Some(CommError::Timeout {
            op: OpKind::AllReduce,
            ..
        }) => {}
        Some(CommError::Broken {
            op: OpKind::AllReduce,
            cause: BreakCause::TimedOut { rank: 0, seq: 0 },
            ..
        }) => {}
        other => panic!("rank 1: {other:?}"),
    }
}

#[test]
fn different_collectives_are_a_mismatch_on_every_rank() {
    let errs = on_ranks(group(3, config(60_000)), |c| {
        let mut x = vec![1.0f32; 6];
        let first = if c.rank() == 1 {
            c.broadcast_in_place(&mut x, 0)
        } else {
            c.all_reduce_in_place(&mut x, ReduceOp::Sum)
        };
        (first.unwrap_err(), c.barrier().unwrap_err())
    });
    for (r, (first, later)) in errs.iter().enumerate() {
        match first {
            CommError::Mismatch {
                seq: 0,
                field: "op",
                rank,
                peer,
                ..
            } => {
                assert_eq!(*rank, r);
                assert_ne!(*peer, r);
            }
            other => panic!("rank {r}: {other}"),
        }
        assert!(
            matches!(
                later,
                CommError::Broken {
                    cause: BreakCause::Mismatch { seq: 0 },
                    ..
                }
            ),
            "rank {r} afterwards: {later}"
        );
    }
}

#[test]
fn different_lengths_are_a_count_mismatch() {
    let errs = on_ranks(group(2, config(60_000)), |c| {
        let mut x = vec![1.0f32; 4 + c.rank()];
        c.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap_err()
    });
    for (r, e) in errs.iter().enumerate() {
        assert!(
            matches!(e, CommError::Mismatch { field: "count", .. }),
            "rank {r}: {e}"
        );
    }
}

#[test]
fn nobody_listening_is_a_clear_error() {
    let addr = {
        let (_listener, addr) = listen();
        addr
    };
    match tcp::join(&addr, 1, 2, config(300)) {
        Err(CommError::Rendezvous { addr: a, what }) => {
            assert_eq!(a, addr);
            assert!(what.contains("nobody accepted"), "{what}");
        }
        other => panic!("{other:?}"),
    }
    let e = tcp::join("not an address", 1, 2, config(300)).unwrap_err();
    assert!(matches!(e, CommError::Rendezvous { .. }), "{e}");
}

#[test]
fn ranks_that_never_join_are_named() {
    let (listener, _addr) = listen();
    match listener.accept_group(3, config(300)) {
        Err(CommError::Rendezvous { what, .. }) => assert!(what.contains("[1, 2]"), "{what}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_stray_connection_is_dropped_and_the_group_still_forms() {
    let (listener, addr) = listen();
    let mut junk = TcpStream::connect(&addr).expect("connect");
    junk.write_all(b"GET / HTTP/1.0\r\n\r\n").expect("junk");
    let rank1 = std::thread::spawn(move || {
        let c = tcp::join(&addr, 1, 2, config(60_000)).expect("join");
        let mut x = vec![2.0f32; 3];
        c.all_reduce_in_place(&mut x, ReduceOp::Sum).map(|()| x)
    });
    let c = listener.accept_group(2, config(60_000)).expect("rank 0");
    let mut x = vec![1.0f32; 3];
    c.all_reduce_in_place(&mut x, ReduceOp::Sum)
        .expect("all_reduce");
    assert_eq!(x, vec![3.0; 3]);
    assert_eq!(rank1.join().expect("rank 1").expect("rank 1"), vec![3.0; 3]);
}

#[test]
fn a_garbage_rank_0_fails_the_join() {
    let server = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = server.local_addr().expect("address").to_string();
    let fake = std::thread::spawn(move || {
        let (mut s, _) = server.accept().expect("accept");
        let mut hello = [0u8; 14];
        s.read_exact(&mut hello).expect("hello");
        s.write_all(b"HTTP/1.0 400 Bad").expect("junk");
    });
    let e = tcp::join(&addr, 1, 2, config(5_000)).unwrap_err();
    fake.join().expect("fake");
    match e {
        CommError::Rendezvous { what, .. } => assert!(what.contains("malformed welcome"), "{what}"),
        other => panic!("{other}"),
    }
}

#[test]
fn a_garbage_frame_fails_the_collective_on_every_rank() {
    for junk in [vec![0xAB; 36], oversized_header()] {
        let (listener, addr) = listen();
        let fake = std::thread::spawn({
            let addr = addr.clone();
            move || {
                let mut s = TcpStream::connect(&addr).expect("connect");
                s.write_all(&hello(1, 3)).expect("hello");
                let mut welcome = [0u8; 10];
                s.read_exact(&mut welcome).expect("welcome");
                s.write_all(&junk).expect("junk");
                // Hold the connection until rank 0 closes it.
                let _ = s.read_to_end(&mut Vec::new());
            }
        });
        let rank2 = std::thread::spawn(move || {
            let c = tcp::join(&addr, 2, 3, config(60_000)).expect("join");
            all_reduce(&c).unwrap_err()
        });
        let rank0 = listener.accept_group(3, config(60_000)).expect("rank 0");
        let e0 = all_reduce(&rank0).unwrap_err();
        drop(rank0);
        fake.join().expect("fake rank");
        for e in [e0, rank2.join().expect("rank 2")] {
            match e {
                CommError::Broken {
                    op: OpKind::AllReduce,
                    cause: BreakCause::Failed { rank: 1, what },
                    ..
                } => {
                    assert!(what.contains("malformed"), "{what}");
                }
                other => panic!("{other}"),
            }
        }
    }
}

/// A well-formed all-reduce header announcing a payload of u64::MAX bytes.
fn oversized_header() -> Vec<u8> {
    let mut h = b"ZTCF".to_vec();
    h.extend_from_slice(&0u64.to_le_bytes());
    h.extend_from_slice(&[1, 0, 1, 1]);
    h.extend_from_slice(&u32::MAX.to_le_bytes());
    h.extend_from_slice(&10u64.to_le_bytes());
    h.extend_from_slice(&u64::MAX.to_le_bytes());
    h
}

#[test]
fn torchrun_variables_form_a_group() {
    let port = TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let sums = on_ranks(vec![0usize, 1, 2], |rank| {
        let env = LaunchEnv {
            rank,
            world_size: 3,
            local_rank: rank,
            master_addr: "127.0.0.1".into(),
            master_port: port,
        };
        let c = tcp::from_launch(&env, config(60_000)).expect("group");
        let mut x = vec![c.rank() as f32];
        c.all_reduce_in_place(&mut x, ReduceOp::Sum)
            .expect("all_reduce");
        (c.rank(), c.size(), c.backend(), x[0])
    });
    for (r, s) in sums.iter().enumerate() {
        assert_eq!(*s, (r, 3, "tcp", 3.0));
    }
}

#[test]
fn rank_0_reports_its_staging_bytes() {
    let bytes = on_ranks(group(2, config(60_000)), |c| {
        let mut x = vec![1.0f32; 1000];
        c.all_reduce_in_place(&mut x, ReduceOp::Sum)
            .expect("all_reduce");
        c.staging_outside_bytes()
    });
    // Rank 0 stages both ranks' 4000-byte inputs; rank 1 writes straight into its buffer.
    assert!(bytes[0] >= 8000, "{bytes:?}");
    assert_eq!(bytes[1], 0);
}

#[test]
fn a_rank_may_join_before_rank_0_listens() {
    // A free port, released; the joiner retries refused connections until rank 0 binds it.
    let addr = TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("address")
        .to_string();
    let rank1 = std::thread::spawn({
        let addr = addr.clone();
        move || {
            let c = tcp::join(&addr, 1, 2, config(60_000))?;
            let mut x = vec![2.0f32];
            c.all_reduce_in_place(&mut x, ReduceOp::Max).map(|()| x)
        }
    });
    // Give the joiner time to be refused at least once; the outcome does not depend on it.
    std::thread::sleep(Duration::from_millis(100));
    let c = tcp::Listener::bind(&addr)
        .expect("bind the released port")
        .accept_group(2, config(60_000))
        .expect("rank 0");
    let mut x = vec![1.0f32];
    c.all_reduce_in_place(&mut x, ReduceOp::Max)
        .expect("all_reduce");
    assert_eq!(x, vec![2.0]);
    assert_eq!(rank1.join().expect("rank 1").expect("rank 1"), vec![2.0]);
}
