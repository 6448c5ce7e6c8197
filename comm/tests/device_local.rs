//! The device-local protocol on host memory (HostOps): results against a naive per-element
//! reference written here, and bitwise against the host `local` backend.

use std::time::Duration;

use half::{bf16, f16};
use proptest::prelude::*;
use zero_comm::device_local::{self, DeviceLocalComm, HostOps};
use zero_comm::{local, Collective, CommError, Config, F32Element, ReduceOp};

fn input(rank: usize, i: usize, salt: u32) -> f32 {
    // Fractions with many mantissa bits, so summation order and rounding matter.
    let h = (rank as u32 * 7919 + i as u32 * 104_729 + salt).wrapping_mul(2_654_435_761);
    (h % 20_000) as f32 / 997.0 - 10.0
}

/// Naive reduction of element i: widen, combine in rank order, divide, round once.
fn naive<T: F32Element>(world: usize, i: usize, salt: u32, op: ReduceOp) -> T {
    let xs: Vec<f32> = (0..world)
        .map(|r| T::from_f32(input(r, i, salt)).to_f32())
        .collect();
    let mut acc = xs[0];
    for &x in &xs[1..] {
        acc = match op {
            ReduceOp::Sum | ReduceOp::Avg => acc + x,
            ReduceOp::Max => acc.max(x),
            ReduceOp::Min => acc.min(x),
        };
    }
    if op == ReduceOp::Avg {
        acc /= world as f32;
    }
    T::from_f32(acc)
}

fn data<T: F32Element>(rank: usize, len: usize, salt: u32) -> Vec<T> {
    (0..len)
        .map(|i| T::from_f32(input(rank, i, salt)))
        .collect()
}

/// Runs `call` on every rank of a device-local group; returns each rank's recv.
fn run_device<T: F32Element + Send>(
    world: usize,
    call: Collective,
    in_place: bool,
    send_len: usize,
    recv_len: usize,
    salt: u32,
) -> Vec<Vec<T>> {
    let comms = device_local::create(world, Config::with_timeout(Duration::from_secs(20))).unwrap();
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|mut c: DeviceLocalComm<HostOps>| {
                s.spawn(move || {
                    let r = c.rank();
                    let send = data::<T>(r, send_len, salt);
                    let mut recv = if in_place {
                        place(call, r, world, &send, recv_len)
                    } else {
                        vec![T::from_f32(0.0); recv_len]
                    };
                    let send = (!in_place).then_some(send.as_slice());
                    c.run(call, send, &mut recv).unwrap();
                    recv
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// The in-place buffer: the input itself, or for all-gather the input at chunk r.
fn place<T: F32Element>(
    call: Collective,
    r: usize,
    world: usize,
    send: &[T],
    recv_len: usize,
) -> Vec<T> {
    if call == Collective::AllGather {
        let mut buf = vec![T::from_f32(-1.0); recv_len];
        let per = recv_len / world;
        buf[r * per..(r + 1) * per].copy_from_slice(send);
        buf
    } else {
        send.to_vec()
    }
}

/// The same call through `zero_comm::local` (the host backend).
fn run_local<T: F32Element + Send>(
    world: usize,
    call: Collective,
    send_len: usize,
    recv_len: usize,
    salt: u32,
) -> Vec<Vec<T>> {
    let comms = local::create(world).unwrap();
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|c| {
                s.spawn(move || {
                    let send = data::<T>(c.rank(), send_len, salt);
                    let mut recv = vec![T::from_f32(0.0); recv_len];
                    match call {
                        Collective::AllReduce(op) => c.all_reduce(&send, &mut recv, op),
                        Collective::ReduceScatter(op) => c.reduce_scatter(&send, &mut recv, op),
                        Collective::AllGather => c.all_gather(&send, &mut recv),
                        Collective::Broadcast(root) => c.broadcast(&send, &mut recv, root),
                        Collective::Reduce(..) => unreachable!(),
                    }
                    .unwrap();
                    recv
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// What rank r's recv must hold, from the naive reference.
fn expected<T: F32Element>(
    world: usize,
    call: Collective,
    r: usize,
    per: usize,
    salt: u32,
) -> Vec<T> {
    match call {
        Collective::AllReduce(op) => (0..per).map(|i| naive(world, i, salt, op)).collect(),
        Collective::ReduceScatter(op) => (r * per..(r + 1) * per)
            .map(|i| naive(world, i, salt, op))
            .collect(),
        Collective::AllGather => (0..world * per)
            .map(|i| T::from_f32(input(i / per.max(1), i % per.max(1), salt)))
            .collect(),
        Collective::Broadcast(root) => data(root, per, salt),
        Collective::Reduce(..) => unreachable!(),
    }
}

fn bits<T: F32Element>(v: &[T]) -> Vec<u32> {
    v.iter().map(|x| x.to_f32().to_bits()).collect()
}

fn check<T: F32Element + Send>(
    world: usize,
    call: Collective,
    per: usize,
    in_place: bool,
    salt: u32,
) {
    let (send_len, recv_len) = match call {
        Collective::ReduceScatter(_) => (per * world, per),
        Collective::AllGather => (per, per * world),
        _ => (per, per),
    };
    let got = run_device::<T>(
        world,
        call,
        in_place,
        send_len,
        if in_place {
            send_len.max(recv_len)
        } else {
            recv_len
        },
        salt,
    );
    let host = run_local::<T>(world, call, send_len, recv_len, salt);
    for (r, out) in got.iter().enumerate() {
        // In-place reduce-scatter leaves rank r's result at chunk r.
        let out = if in_place && matches!(call, Collective::ReduceScatter(_)) {
            &out[r * per..(r + 1) * per]
        } else {
            &out[..]
        };
        let want = expected::<T>(world, call, r, per, salt);
        assert_eq!(
            bits(out),
            bits(&want),
            "{call:?} rank {r} vs naive reference"
        );
        assert_eq!(
            bits(out),
            bits(&host[r]),
            "{call:?} rank {r} vs local backend"
        );
    }
}

fn calls(op: ReduceOp, root: usize) -> [Collective; 4] {
    [
        Collective::AllReduce(op),
        Collective::ReduceScatter(op),
        Collective::AllGather,
        Collective::Broadcast(root),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn every_collective_matches_the_reference_and_the_local_backend(
        world in 1usize..=5,
        per in 0usize..9,
        op in prop::sample::select(vec![ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min]),
        dtype in 0u8..3,
        in_place: bool,
        root_pick in 0usize..5,
        salt in 0u32..1000,
    ) {
        for call in calls(op, root_pick % world) {
            match dtype {
                0 => check::<f32>(world, call, per, in_place, salt),
                1 => check::<bf16>(world, call, per, in_place, salt),
                _ => check::<f16>(world, call, per, in_place, salt),
            }
        }
    }
}

#[test]
fn all_reduce_of_a_length_not_divisible_by_the_world_matches_the_reference() {
    for len in [1, 7, 13] {
        check::<f32>(3, Collective::AllReduce(ReduceOp::Sum), len, false, 5);
        check::<bf16>(4, Collective::AllReduce(ReduceOp::Avg), len, true, 9);
    }
}

#[test]
fn a_rank_that_drops_its_communicator_makes_the_others_fail_not_hang() {
    let comms = device_local::create(3, Config::with_timeout(Duration::from_millis(300))).unwrap();
    let results: Vec<Result<(), CommError>> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|mut c| {
                s.spawn(move || {
                    if c.rank() == 2 {
                        drop(c);
                        return Ok(());
                    }
                    let mut x = vec![1.0f32; 4];
                    c.run::<f32>(Collective::AllReduce(ReduceOp::Sum), None, &mut x)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (r, res) in results.iter().enumerate().take(2) {
        assert!(
            matches!(
                res,
                Err(CommError::Broken { .. } | CommError::Timeout { .. })
            ),
            "rank {r}: {res:?}"
        );
    }
}

#[test]
fn ranks_that_disagree_on_the_length_get_a_mismatch_error() {
    let comms = device_local::create(2, Config::with_timeout(Duration::from_secs(20))).unwrap();
    let results: Vec<Result<(), CommError>> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|mut c| {
                s.spawn(move || {
                    let mut x = vec![1.0f32; 4 + c.rank()];
                    c.run::<f32>(Collective::AllReduce(ReduceOp::Sum), None, &mut x)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (r, res) in results.iter().enumerate() {
        assert!(
            matches!(res, Err(CommError::Mismatch { field: "count", .. })),
            "rank {r}: {res:?}"
        );
    }
}

#[test]
fn buffers_that_do_not_fit_the_layout_are_an_error_before_any_exchange() {
    let mut comms = device_local::create(2, Config::default()).unwrap();
    let c = &mut comms[0];
    let send = vec![0.0f32; 5];
    let mut recv = vec![0.0f32; 2];
    let rs = c.run(
        Collective::ReduceScatter(ReduceOp::Sum),
        Some(&send),
        &mut recv,
    );
    assert!(
        matches!(
            rs,
            Err(CommError::Length {
                expected: 4,
                got: 5,
                ..
            })
        ),
        "{rs:?}"
    );
    let mut odd = vec![0.0f32; 3];
    let ag = c.run::<f32>(Collective::AllGather, None, &mut odd);
    assert!(
        matches!(ag, Err(CommError::InvalidArgument { .. })),
        "{ag:?}"
    );
    let bc = c.run::<f32>(Collective::Broadcast(2), None, &mut odd);
    assert!(
        matches!(
            bc,
            Err(CommError::Root {
                root: 2,
                size: 2,
                ..
            })
        ),
        "{bc:?}"
    );
}
