//! The conformance suite on the TCP backend (groups of 1..=4 threads over 127.0.0.1, port 0),
//! and bitwise equality with the local backend on random data.

#[macro_use]
mod conformance;

use std::time::Duration;

use half::bf16;
use proptest::prelude::*;
use zero_comm::{local, tcp, Communicator, Config, Element, ReduceOp};

/// Generous: a case that hangs fails after this instead of hanging the test run.
fn config() -> Config {
    Config::with_timeout(Duration::from_secs(60))
}

/// A TCP group of `n` over loopback; element r is rank r's communicator.
fn tcp_group(n: usize) -> Vec<Communicator> {
    let listener = tcp::Listener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("address").to_string();
    std::thread::scope(|s| {
        let joins: Vec<_> = (1..n)
            .map(|r| {
                let addr = addr.clone();
                s.spawn(move || tcp::join(&addr, r, n, config()))
            })
            .collect();
        let mut comms = vec![listener.accept_group(n, config()).expect("rank 0")];
        for j in joins {
            comms.push(j.join().expect("join thread").expect("join"));
        }
        comms
    })
}

/// Runs `f` on every rank's thread; results in rank order.
fn on_ranks<R: Send>(comms: Vec<Communicator>, f: impl Fn(&Communicator) -> R + Sync) -> Vec<R> {
    let f = &f;
    std::thread::scope(|s| {
        let hs: Vec<_> = comms.into_iter().map(|c| s.spawn(move || f(&c))).collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect()
    })
}

fn run_case(n: usize, case: conformance::Case) -> Vec<String> {
    on_ranks(tcp_group(n), case)
        .into_iter()
        .enumerate()
        .filter_map(|(r, res)| res.err().map(|e| format!("rank {r}: {e}")))
        .collect()
}

stamp_every_case!();

#[test]
fn every_case_is_stamped_out() {
    let names: Vec<&str> = conformance::CASES.iter().map(|&(n, _)| n).collect();
    assert_eq!(names, STAMPED);
}

/// Every collective's output bytes on one rank, in a fixed order, for inputs `ins[rank]`.
fn outputs<T: Element>(
    c: &Communicator,
    ins: &[Vec<T>],
    op: ReduceOp,
    root: usize,
) -> Vec<Vec<u8>> {
    let (n, r) = (c.size(), c.rank());
    let mine = &ins[r];
    let len = mine.len();
    let per = len / n;
    let bytes = |v: &[T]| -> Vec<u8> {
        let p = v.as_ptr().cast::<u8>();
        // SAFETY: `v` is a live slice of plain floats; the view covers exactly its bytes.
        unsafe { std::slice::from_raw_parts(p, std::mem::size_of_val(v)) }.to_vec()
    };
    let mut out = Vec::new();
    let mut buf = vec![T::default(); len];
    c.all_reduce(mine, &mut buf, op).expect("all_reduce");
    out.push(bytes(&buf));
    let mut buf = mine.clone();
    c.all_reduce_in_place(&mut buf, op)
        .expect("all_reduce in place");
    out.push(bytes(&buf));
    let mut chunk = vec![T::default(); per];
    c.reduce_scatter(&mine[..per * n], &mut chunk, op)
        .expect("reduce_scatter");
    out.push(bytes(&chunk));
    let mut buf = mine[..per * n].to_vec();
    c.reduce_scatter_in_place(&mut buf, op)
        .expect("reduce_scatter in place");
    out.push(bytes(&buf));
    let mut buf = vec![T::default(); len];
    c.reduce(mine, &mut buf, op, root).expect("reduce");
    out.push(bytes(if r == root { &buf } else { &[] }));
    let mut gathered = vec![T::default(); per * n];
    c.all_gather(&mine[..per], &mut gathered)
        .expect("all_gather");
    out.push(bytes(&gathered));
    let mut buf = mine.clone();
    c.broadcast_in_place(&mut buf, root).expect("broadcast");
    out.push(bytes(&buf));
    out
}

fn compare<T: Element>(n: usize, ins: &[Vec<T>], op: ReduceOp, root: usize) {
    let ins = &ins[..n];
    let want = on_ranks(local::create(n).expect("local group"), |c| {
        outputs(c, ins, op, root)
    });
    let got = on_ranks(tcp_group(n), |c| outputs(c, ins, op, root));
    assert_eq!(got, want, "{n} ranks, {op}, root {root}, {:?}", T::DTYPE);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn results_are_bitwise_the_local_backends(
        // Weighted to 3-4 ranks and several elements: where reduction order shows in the bits.
        n in prop_oneof![1usize..=2, 3usize..=4, 3usize..=4],
        len in prop_oneof![Just(0usize), Just(1), 2usize..40, 2usize..40],
        op in prop_oneof![Just(ReduceOp::Sum), Just(ReduceOp::Avg), Just(ReduceOp::Max), Just(ReduceOp::Min)],
        root_pick in 0usize..4,
        seed in any::<u64>(),
    ) {
        // A small LCG: varied magnitudes and signs, so roundings differ by order.
        let mut x = seed | 1;
        let mut next = move || {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let m = ((x >> 40) as f32) / (1u64 << 24) as f32 - 0.5;
            m * 10f32.powi(((x >> 20) % 7) as i32 - 3)
        };
        let ins: Vec<Vec<f32>> = (0..4).map(|_| (0..len).map(|_| next()).collect()).collect();
        let halves: Vec<Vec<bf16>> = ins.iter().map(|v| v.iter().map(|&f| bf16::from_f32(f)).collect()).collect();
        compare(n, &ins, op, root_pick % n);
        compare(n, &halves, op, root_pick % n);
        // Wider types: f64 of the same values scaled past f32's precision, and integers over
        // their whole range (sums wrap; avg is refused for integers, so they sum instead).
        let wide: Vec<Vec<f64>> = ins.iter().map(|v| v.iter().map(|&f| f64::from(f) * (1.0 + 1e-12)).collect()).collect();
        let int_op = if op == ReduceOp::Avg { ReduceOp::Sum } else { op };
        let ints: Vec<Vec<i64>> = ins.iter().map(|v| v.iter().map(|&f| (f64::from(f) * 1e18) as i64).collect()).collect();
        let ints32: Vec<Vec<i32>> = ints.iter().map(|v| v.iter().map(|&x| (x >> 20) as i32).collect()).collect();
        compare(n, &wide, op, root_pick % n);
        compare(n, &ints, int_op, root_pick % n);
        compare(n, &ints32, int_op, root_pick % n);
    }
}
