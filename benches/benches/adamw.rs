//! The host AdamW update (`zero::optim::AdamW::update`), the optimizer of every CPU run and of
//! ZeRO-Offload: elements per second over one shard of 16M fp32 parameters (a 1.5B model's
//! shard at N_d = 96, or GPT-2 124M's embedding shard at N_d = 2), in one decaying segment.
//!
//! `cargo bench -p zero-benches --bench adamw`

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use zero::optim::{AdamW, DecaySegment};

const N: usize = 16 << 20;

fn adamw(c: &mut Criterion) {
    let mut p: Vec<f32> = (0..N).map(|i| (i % 97) as f32 * 1e-3).collect();
    let g: Vec<f32> = (0..N).map(|i| (i % 89) as f32 * 1e-4 - 4e-3).collect();
    let (mut m, mut v) = (vec![0f32; N], vec![0f32; N]);
    let segments = [DecaySegment {
        range: 0..N,
        decay: true,
    }];
    let opt = AdamW::default();
    let mut group = c.benchmark_group("adamw");
    group.throughput(Throughput::Elements(N as u64));
    group.sample_size(10);
    let mut step = 0;
    group.bench_function("16M fp32", |b| {
        b.iter(|| {
            step += 1;
            opt.update(&mut p, &g, &mut m, &mut v, 0, &segments, step, 1e-3)
                .expect("valid arguments");
        });
    });
    group.finish();
}

criterion_group!(benches, adamw);
criterion_main!(benches);
