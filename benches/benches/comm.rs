//! Criterion benches of the local collectives, in bytes/s of the whole array (algbw).
//!
//! Each sample spawns one thread per rank that runs `iters` collectives back to back; the
//! sample time is the slowest rank's. 2 ranks (this machine has 2 cores), f32 and bf16.
use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use half::bf16;
use zero_comm::{local, Collective, F32Element, ReduceOp};

const RANKS: usize = 2;

fn time_collective<T: F32Element>(call: Collective, count: usize, iters: u64) -> Duration {
    let comms = local::create(RANKS).expect("2 ranks");
    std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .into_iter()
            .map(|c| {
                s.spawn(move || {
                    // Non-zero fill faults every page in here, outside the timed loop.
                    let mut buf = vec![T::from_f32(1.0); count];
                    c.barrier().expect("barrier");
                    let t = Instant::now();
                    for _ in 0..iters {
                        c.collective::<T>(call, None, black_box(&mut buf))
                            .expect("collective");
                    }
                    t.elapsed()
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank"))
            .max()
            .unwrap_or_default()
    })
}

fn collectives(c: &mut Criterion) {
    let calls = [
        ("all_reduce", Collective::AllReduce(ReduceOp::Sum)),
        ("reduce_scatter", Collective::ReduceScatter(ReduceOp::Sum)),
        ("all_gather", Collective::AllGather),
        ("broadcast", Collective::Broadcast(0)),
    ];
    for (name, call) in calls {
        let mut g = c.benchmark_group(format!("local_{name}"));
        g.sample_size(10).measurement_time(Duration::from_secs(2));
        for bytes in [64 << 10, 4 << 20, 64 << 20] {
            g.throughput(Throughput::Bytes(bytes as u64));
            g.bench_function(BenchmarkId::new("f32", bytes), |b| {
                b.iter_custom(|iters| time_collective::<f32>(call, bytes / 4, iters))
            });
            if name == "all_reduce" {
                g.bench_function(BenchmarkId::new("bf16", bytes), |b| {
                    b.iter_custom(|iters| time_collective::<bf16>(call, bytes / 2, iters))
                });
            }
        }
        g.finish();
    }
}

criterion_group!(benches, collectives);
criterion_main!(benches);
