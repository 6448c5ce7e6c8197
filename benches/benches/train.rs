//! Criterion benches of the train layer: one GPT-2 (124M) forward+backward at B=4, T=64, and
//! beside it the `gemm` crate's f32 throughput on a representative GPT-2 matmul shape, so the
//! step's achieved GFLOP/s can be read against the GEMM peak of the same machine, same run.
//!
//! `cargo bench -p zero-benches --bench train`
//!
//! Criterion reports the step as tokens/s (`elem/s`) and the GEMM as FLOP/s (`elem/s`, one
//! element = one FLOP). A summary line with both GFLOP/s figures and their ratio is printed
//! before criterion's output, from a short timing loop of its own, by wall time and by CPU
//! time (see `cpu_secs`): run with `RAYON_NUM_THREADS=1` for the load-independent figure.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use zero::gpt::{init_params, kernels::matmul, Activations, CpuBackend, Gpt, GptConfig};

const B: usize = 4;
const T: usize = 64;
/// The GEMM reference: the MLP's first matmul at this batch, out (B*T, 4C) = in (B*T, C) · Wᵀ.
const GEMM_SHAPE: (usize, usize, usize) = (B * T, 768, 3072);

struct Step {
    b: usize,
    t: usize,
    model: Gpt,
    acts: Activations,
    params: Vec<Vec<f32>>,
    grads: Vec<Vec<f32>>,
    tokens: Vec<u32>,
    targets: Vec<u32>,
}

impl Step {
    fn new(config: GptConfig, b: usize, t: usize) -> Self {
        let model = Gpt::new(config).expect("presets are valid");
        let params = init_params(&config, model.layout(), 0);
        let grads = model
            .layout()
            .unit_lens()
            .iter()
            .map(|&n| vec![0.0; n])
            .collect();
        let acts = model.activations(b, t).expect("T fits the preset");
        let vocab = config.vocab_size as u32;
        let tokens = (0..(b * t) as u32).map(|i| (i * 7919) % vocab).collect();
        let targets = (0..(b * t) as u32)
            .map(|i| (i * 104_729 + 1) % vocab)
            .collect();
        Self {
            b,
            t,
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
        let attention = 6.0 * (cfg.num_layers * self.t * cfg.channels) as f64;
        (self.b * self.t) as f64 * (6.0 * params + attention)
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

/// Wall and CPU seconds of a measured region.
#[derive(Clone, Copy, Default)]
struct Cost {
    wall: f64,
    cpu: f64,
}

/// CPU seconds used so far by the whole process (all threads), from `/proc/self/stat`
/// (utime + stime in USER_HZ = 100 ticks/s); `None` off Linux.
///
/// Why: this machine is shared, and while others compile, wall time measures them as much as
/// us. CPU time does not: with `RAYON_NUM_THREADS=1` it is the cost of the code itself.
/// (With more threads it also counts rayon's idle spinning, so read it single-threaded.)
fn cpu_secs() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the parenthesised command name: state is field 3, utime 14, stime 15.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

/// Runs `f` `iters` times after one warm-up call; returns the fastest call's wall time (other
/// processes only ever add time, so the minimum is the least biased wall estimate) and the
/// mean CPU time per call.
fn measure(iters: usize, mut f: impl FnMut()) -> Cost {
    f();
    let cpu0 = cpu_secs().unwrap_or(f64::NAN);
    let mut wall = f64::INFINITY;
    for _ in 0..iters {
        let start = Instant::now();
        f();
        wall = wall.min(start.elapsed().as_secs_f64());
    }
    let cpu = (cpu_secs().unwrap_or(f64::NAN) - cpu0) / iters as f64;
    Cost { wall, cpu }
}

fn train(c: &mut Criterion) {
    // zero-train's default model at its default batch: how many tokens/s it trains at.
    let mut small = Step::new(GptConfig::small(), 4, 256);
    let cost = measure(3, || {
        black_box(small.run());
    });
    println!(
        "train summary: small (L=4 C=256) B=4 T=256 step {:.1} ms, {:.0} tokens/s, {:.1} GFLOP/s",
        cost.wall * 1e3,
        1024.0 / cost.wall,
        small.flops() / cost.wall / 1e9
    );
    drop(small);

    let mut step = Step::new(GptConfig::gpt2(), B, T);
    let mut gemm = Gemm::new();
    // Interleaved rounds, so both figures see the same moments of a shared machine's load;
    // about 1 s of GEMM and 4 steps in all, so the 10 ms CPU clock resolves them to ~1%.
    let rounds = 4;
    let (mut g, mut s) = (
        Cost {
            wall: f64::INFINITY,
            cpu: 0.0,
        },
        Cost {
            wall: f64::INFINITY,
            cpu: 0.0,
        },
    );
    for _ in 0..rounds {
        let gc = measure(40, || gemm.run());
        let sc = measure(1, || {
            black_box(step.run());
        });
        g = Cost {
            wall: g.wall.min(gc.wall),
            cpu: g.cpu + gc.cpu / rounds as f64,
        };
        s = Cost {
            wall: s.wall.min(sc.wall),
            cpu: s.cpu + sc.cpu / rounds as f64,
        };
    }
    let gf = |flops: f64, secs: f64| flops / secs / 1e9;
    println!(
        "train summary: threads {} | gemm {}x{}x{} f32: {:.1} GFLOP/s wall (best), {:.1} per CPU-second \
         | gpt2 B={B} T={T} step: {:.1} ms, {:.0} tokens/s, {:.1} GFLOP/s wall = {:.0}% of gemm; \
         {:.1} GFLOP per CPU-second = {:.0}% of gemm",
        CpuBackend::num_threads(),
        GEMM_SHAPE.0,
        GEMM_SHAPE.1,
        GEMM_SHAPE.2,
        gf(Gemm::flops(), g.wall),
        gf(Gemm::flops(), g.cpu),
        s.wall * 1e3,
        (B * T) as f64 / s.wall,
        gf(step.flops(), s.wall),
        100.0 * g.wall / s.wall * step.flops() / Gemm::flops(),
        gf(step.flops(), s.cpu),
        100.0 * g.cpu / s.cpu * step.flops() / Gemm::flops(),
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
