//! Step time of ZeRO stages 1, 2 and 3 against stage 0, at the same world size, in one run.
//!
//! Each sample builds a local group of `WORLD` ranks, trains a few warm-up steps, then times
//! `iters` optimizer steps of a small GPT on rank 0 (every step ends in collectives, so the
//! ranks run in lock-step). Throughput is in tokens of the global batch.
//!
//! `cargo bench -p zero-benches --bench zero_stages`

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::time::{Duration, Instant};
use zero::{EngineConfig, Precision, ZeroStage};
use zero_gpt::{init_unit, Gpt, GptConfig};
use zero_train::bridge::{gpt_engine, micro_step};

const WORLD: usize = 2;
const B: usize = 4; // sequences per rank
const T: usize = 64;
const WARMUP_STEPS: u64 = 2;

/// L=4, NH=4, C=128 over a 4096-token vocabulary: 1.3M parameters, small enough that a
/// sample takes a second on two cores, large enough that every unit is several buckets.
fn model() -> GptConfig {
    GptConfig::new(T, 4096, 4, 4, 128).expect("a valid shape")
}

/// Trains `WARMUP_STEPS + iters` steps on every rank and returns rank 0's time for the last
/// `iters`.
fn time_steps(stage: ZeroStage, precision: Precision, iters: u64) -> Duration {
    let config = model();
    let comms = zero_comm::local::create(WORLD).expect("a local group");
    let times: Vec<Duration> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|comm| {
                s.spawn(move || {
                    let gpt = Gpt::new(config).expect("model");
                    let layout = gpt.layout().clone();
                    let engine_config = EngineConfig {
                        stage,
                        precision,
                        ..EngineConfig::default()
                    };
                    let mut engine = gpt_engine(comm, &layout, None, engine_config, |unit, w| {
                        init_unit(&config, &layout, unit, 1, w).expect("init");
                    })
                    .expect("engine");
                    let mut acts = gpt.activations(B, T).expect("activations");
                    let rank = engine.rank() as u32;
                    let x: Vec<u32> = (0..(B * T) as u32).map(|i| (i * 7 + rank) % 4096).collect();
                    let y: Vec<u32> = x.iter().map(|&t| (t + 1) % 4096).collect();
                    let mut start = Instant::now();
                    for step in 0..WARMUP_STEPS + iters {
                        if step == WARMUP_STEPS {
                            start = Instant::now();
                        }
                        micro_step(&mut engine, &gpt, &mut acts, &x, &y).expect("micro-step");
                        engine.step(1e-4).expect("step");
                    }
                    start.elapsed()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect()
    });
    times[0]
}

fn stages(c: &mut Criterion) {
    for precision in [Precision::Fp32, Precision::Bf16] {
        let mut group = c.benchmark_group(format!("zero_step_{precision:?}_N{WORLD}"));
        group.sample_size(10);
        group.measurement_time(Duration::from_secs(8));
        group.throughput(Throughput::Elements((WORLD * B * T) as u64));
        for stage in ZeroStage::ALL {
            group.bench_with_input(
                BenchmarkId::from_parameter(stage as u8),
                &stage,
                |b, &stage| b.iter_custom(|iters| time_steps(stage, precision, iters)),
            );
        }
        group.finish();
    }
}

criterion_group!(benches, stages);
criterion_main!(benches);
