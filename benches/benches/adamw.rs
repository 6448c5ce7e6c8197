//! The host AdamW update (`zero::optim::AdamW::update`), the optimizer of every CPU run and of
//! ZeRO-Offload, over one shard of 16M fp32 parameters (a 1.5B model's shard at N_d = 96, or
//! GPT-2 124M's embedding shard at N_d = 2), in one decaying segment.
//!
//! Beside it, the memory floor of the same update: a pass over the same four arrays, split the
//! same way on rayon's pool, that reads p, g, m, v and writes p, m, v (28 bytes per element,
//! as AdamW) with one multiply-add each. Both report bytes per second, so their ratio says how
//! much room arithmetic (SIMD, as in DeepSpeed's CPU Adam) could still win: none once AdamW
//! runs at the floor's speed.
//!
//! `cargo bench -p zero-benches --bench adamw`

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use rayon::prelude::*;
use zero::optim::{AdamW, DecaySegment};

const N: usize = 16 << 20;
/// Bytes an element's update moves: four f32 read (p, g, m, v), three written (p, m, v).
const BYTES_PER_ELEMENT: u64 = 28;
/// Elements per rayon task in the floor pass (the host AdamW's own task size).
const TASK: usize = 1 << 16;

/// The memory floor: AdamW's traffic with a multiply-add where AdamW has its arithmetic.
fn same_traffic(p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32]) {
    p.par_chunks_mut(TASK)
        .zip(g.par_chunks(TASK))
        .zip(m.par_chunks_mut(TASK))
        .zip(v.par_chunks_mut(TASK))
        .for_each(|(((p, g), m), v)| {
            for (((p, g), m), v) in p.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut()) {
                *m = 0.9 * *m + *g;
                *v = 0.999 * *v + *g;
                *p -= 1e-3 * (*m + *v);
            }
        });
}

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
    group.throughput(Throughput::Bytes(BYTES_PER_ELEMENT * N as u64));
    group.sample_size(10);
    let mut step = 0;
    group.bench_function("16M fp32", |b| {
        b.iter(|| {
            step += 1;
            opt.update(&mut p, &g, &mut m, &mut v, 0, &segments, step, 1e-3)
                .expect("valid arguments");
        });
    });
    group.bench_function("16M fp32, same traffic, no arithmetic", |b| {
        b.iter(|| same_traffic(&mut p, &g, &mut m, &mut v));
    });
    group.finish();
}

criterion_group!(benches, adamw);
criterion_main!(benches);
