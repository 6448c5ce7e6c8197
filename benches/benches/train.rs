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
use zero_gpt::kernels::{attention, cross_entropy, gelu, layernorm, matmul};
use zero_gpt::{init_params, Activations, CpuBackend, Gpt, GptConfig};

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

    /// FLOPs of one step (see `Gpt::flops_per_token`).
    fn flops(&self) -> f64 {
        (self.b * self.t) as f64 * self.model.flops_per_token(self.t)
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

/// CPU milliseconds per call of `f`, over about 0.3 s of CPU time (after one warm-up call).
fn cpu_ms(mut f: impl FnMut()) -> f64 {
    f();
    let Some(start) = cpu_secs() else {
        return f64::NAN;
    };
    let mut calls = 0u32;
    while cpu_secs().unwrap_or(f64::INFINITY) - start < 0.3 {
        f();
        calls += 1;
    }
    (cpu_secs().unwrap_or(f64::NAN) - start) * 1e3 / f64::from(calls)
}

/// Where one gpt2 step's time goes: each kernel once at the step's shapes, CPU time per call,
/// GFLOP per CPU-second for the matmuls.
fn kernel_breakdown() {
    let (n, c, nh, vp, v) = (B * T, 768, 12, 50_304, 50_257);
    let fill =
        |len: usize| -> Vec<f32> { (0..len).map(|i| ((i % 97) as f32 - 48.0) * 1e-2).collect() };
    for (name, k, oc) in [
        ("qkv", c, 3 * c),
        ("attproj", c, c),
        ("fc", c, 4 * c),
        ("fcproj", 4 * c, c),
        ("lm head", c, vp),
    ] {
        let (inp, w, mut out) = (fill(n * k), fill(oc * k), fill(n * oc));
        let (mut dinp, mut dw) = (fill(n * k), fill(oc * k));
        let flops = 2.0 * (n * k * oc) as f64;
        let fwd = cpu_ms(|| matmul::matmul_forward(&mut out, &inp, &w, None, n, k, oc));
        let bwd =
            cpu_ms(|| matmul::matmul_backward(&mut dinp, &mut dw, None, &out, &inp, &w, n, k, oc));
        println!(
            "train summary: kernel matmul {name:8} {n}x{k}x{oc}: fwd {fwd:7.2} ms ({:5.1} GFLOP/s), bwd {bwd:7.2} ms ({:5.1} GFLOP/s)",
            flops / fwd / 1e6,
            2.0 * flops / bwd / 1e6
        );
    }
    let (qkv, mut att, mut out, mut dqkv) = (
        fill(n * 3 * c),
        fill(n * nh * T),
        fill(n * c),
        fill(n * 3 * c),
    );
    let fwd = cpu_ms(|| attention::attention_forward(&mut out, &mut att, &qkv, B, T, c, nh));
    let bwd = cpu_ms(|| attention::attention_backward(&mut dqkv, &out, &qkv, &att, B, T, c, nh));
    println!("train summary: kernel attention: fwd {fwd:.2} ms, bwd {bwd:.2} ms");
    let (x, mut y, mut dx) = (fill(n * 4 * c), fill(n * 4 * c), fill(n * 4 * c));
    let fwd = cpu_ms(|| gelu::gelu_forward(&mut y, &x));
    let bwd = cpu_ms(|| gelu::gelu_backward(&mut dx, &x, &y));
    println!("train summary: kernel gelu: fwd {fwd:.2} ms, bwd {bwd:.2} ms");
    let (x, mut y, mut dx, w) = (fill(n * c), fill(n * c), fill(n * c), fill(c));
    let (mut mean, mut rstd, mut dw, mut db) = (fill(n), fill(n), fill(c), fill(c));
    let fwd =
        cpu_ms(|| layernorm::layernorm_forward(&mut y, &mut mean, &mut rstd, &x, &w, &w, n, c));
    let bwd = cpu_ms(|| {
        layernorm::layernorm_backward(&mut dx, &mut dw, &mut db, &y, &x, &w, &mean, &rstd, n, c)
    });
    println!("train summary: kernel layernorm: fwd {fwd:.2} ms, bwd {bwd:.2} ms");
    let (mut logits, mut losses) = (fill(n * vp), fill(n));
    let targets: Vec<u32> = (0..n as u32).collect();
    let dlosses = vec![1.0 / n as f32; n];
    let both = cpu_ms(|| {
        cross_entropy::crossentropy_forward(&mut losses, &mut logits, &targets, n, v, vp);
        cross_entropy::crossentropy_backward(&mut logits, &dlosses, &targets, n, v, vp);
    });
    println!("train summary: kernel softmax+cross-entropy fwd+bwd: {both:.2} ms");
}

fn train(c: &mut Criterion) {
    kernel_breakdown();
    small_summary();
    let mut step = Step::new(GptConfig::gpt2(), B, T);
    let mut gemm = Gemm::new();
    gpt2_against_gemm(&mut step, &mut gemm);

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

/// Prints zero-train's default model's step at its default batch: how many tokens/s it
/// trains at.
fn small_summary() {
    let mut small = Step::new(GptConfig::small(), 4, 256);
    let cost = measure(3, || {
        black_box(small.run());
    });
    println!(
        "train summary: small (L=4 C=256) B=4 T=256 step {:.1} ms wall (best of 3), {:.0} tokens/s, \
         {:.1} GFLOP/s; {:.1} ms CPU, {:.1} GFLOP per CPU-second",
        cost.wall * 1e3,
        1024.0 / cost.wall,
        small.flops() / cost.wall / 1e9,
        cost.cpu * 1e3,
        small.flops() / cost.cpu / 1e9
    );
    drop(small);
}

/// Prints GPT-2's step beside a GEMM of the same machine: the share of the GEMM rate the
/// step reaches.
fn gpt2_against_gemm(step: &mut Step, gemm: &mut Gemm) {
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
}

criterion_group!(benches, train);
criterion_main!(benches);
