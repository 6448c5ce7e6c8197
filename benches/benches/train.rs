//! Criterion benches of the train layer: one GPT-2 (124M) forward+backward at B=4, T=64, and
//! beside it the `gemm` crate's f32 throughput on a representative GPT-2 matmul shape, so the
//! step's achieved GFLOP/s can be read against the GEMM peak of the same machine, same run.
//!
//! `cargo bench -p zero-benches --bench train`
//!
//! Criterion reports the step as tokens/s (`elem/s`) and the GEMM as FLOP/s (`elem/s`, one
//! element = one FLOP). A summary line with both GFLOP/s figures and their ratio is printed
//! before criterion's output, from a short timing loop of its own.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use zero::gpt::{init_params, kernels::matmul, Activations, CpuBackend, Gpt, GptConfig};

const B: usize = 4;
const T: usize = 64;
/// The GEMM reference: the MLP's first matmul at this batch, out (B*T, 4C) = in (B*T, C) · Wᵀ.
const GEMM_SHAPE: (usize, usize, usize) = (B * T, 768, 3072);

struct Step {
    model: Gpt,
    acts: Activations,
    params: Vec<Vec<f32>>,
    grads: Vec<Vec<f32>>,
    tokens: Vec<u32>,
    targets: Vec<u32>,
}

impl Step {
    fn new() -> Self {
        let config = GptConfig::gpt2();
        let model = Gpt::new(config).expect("gpt2 preset is valid");
        let params = init_params(&config, model.layout(), 0);
        let grads = model
            .layout()
            .unit_lens()
            .iter()
            .map(|&n| vec![0.0; n])
            .collect();
        let acts = model.activations(B, T).expect("B=4, T=64 fits gpt2");
        let vocab = config.vocab_size as u32;
        let tokens = (0..(B * T) as u32).map(|i| (i * 7919) % vocab).collect();
        let targets = (0..(B * T) as u32)
            .map(|i| (i * 104_729 + 1) % vocab)
            .collect();
        Self {
            model,
            acts,
            params,
            grads,
            tokens,
            targets,
        }
    }

    fn run(&mut self) -> f32 {
        // Gradients accumulate across iterations; that is the same work as zeroing them.
        let s = self;
        s.model
            .forward_backward(&mut s.acts, &s.params, &mut s.grads, &s.tokens, &s.targets)
            .expect("shapes come from the model's own layout")
    }

    /// FLOPs of one step: 6 per parameter per token (forward 2, backward 4, as llm.c and PaLM
    /// count), plus causal attention's 6·L·T·C per token (scores and weighted sum, forward
    /// and backward, half the T×T square).
    fn flops(&self) -> f64 {
        let cfg = self.model.config();
        let params = self.model.layout().num_params() as f64;
        let attention = 6.0 * (cfg.num_layers * T * cfg.channels) as f64;
        (B * T) as f64 * (6.0 * params + attention)
    }
}

struct Gemm {
    out: Vec<f32>,
    inp: Vec<f32>,
    weight: Vec<f32>,
}

impl Gemm {
    fn new() -> Self {
        let (n, c, oc) = GEMM_SHAPE;
        let fill = |len: usize| (0..len).map(|i| ((i % 97) as f32 - 48.0) * 1e-3).collect();
        Self {
            out: vec![0.0; n * oc],
            inp: fill(n * c),
            weight: fill(oc * c),
        }
    }

    fn run(&mut self) {
        let (n, c, oc) = GEMM_SHAPE;
        matmul::matmul_forward(&mut self.out, &self.inp, &self.weight, None, n, c, oc);
    }

    fn flops() -> f64 {
        let (n, c, oc) = GEMM_SHAPE;
        2.0 * (n * c * oc) as f64
    }
}

/// Fastest of `iters` calls of `f`, after one warm-up call. Best-of rather than median: on a
/// shared machine other processes only ever add time, so the minimum is the least biased
/// estimate of what the code itself costs (applied to the step and the GEMM alike).
fn best_secs(iters: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut times: Vec<f64> = (0..iters)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[0]
}

fn train(c: &mut Criterion) {
    let mut step = Step::new();
    let mut gemm = Gemm::new();

    let gemm_secs = best_secs(50, || gemm.run());
    let step_secs = best_secs(5, || {
        black_box(step.run());
    });
    let gemm_gflops = Gemm::flops() / gemm_secs / 1e9;
    let step_gflops = step.flops() / step_secs / 1e9;
    println!(
        "train summary: threads {} | gemm {}x{}x{} f32 {gemm_gflops:.1} GFLOP/s | gpt2 B={B} T={T} \
         step {:.1} ms, {:.0} tokens/s, {step_gflops:.1} GFLOP/s = {:.0}% of gemm",
        CpuBackend::num_threads(),
        GEMM_SHAPE.0,
        GEMM_SHAPE.1,
        GEMM_SHAPE.2,
        step_secs * 1e3,
        (B * T) as f64 / step_secs,
        100.0 * step_gflops / gemm_gflops,
    );

    let mut group = c.benchmark_group("train");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(2))
        .measurement_time(Duration::from_secs(8));
    group.throughput(Throughput::Elements(Gemm::flops() as u64));
    group.bench_function("gemm_f32_256x768x3072 (elem = FLOP)", |bch| {
        bch.iter(|| gemm.run())
    });
    group.throughput(Throughput::Elements((B * T) as u64));
    group.bench_function("gpt2_forward_backward_B4_T64 (elem = token)", |bch| {
        bch.iter(|| black_box(step.run()))
    });
    group.finish();
}

criterion_group!(benches, train);
criterion_main!(benches);
