//! `zero-bench-memory`: the paper's memory claim end to end. For N_d local ranks and a
//! per-rank cap, finds the largest GPT that trains at stages 0-3, each with and without
//! activation checkpointing, growing the layers at a fixed width and the width at fixed
//! layers.
//!
//! ```text
//! cargo run --release -p zero-benches --bin zero-bench-memory -- --ranks 8 --memory-limit 512M
//! ```
//! Each search doubles the grown dimension while the start-up plan (the engine's plan plus the
//! model's activations, the bound `zero-train --memory-limit` enforces) fits the cap, then
//! bisects; the largest model found is confirmed by training two steps under the cap (a
//! failure steps down until one trains). A step time is the median of `--timed-steps` steps
//! after a warm-up step, stage s and stage 0 both on stage 0's largest model, so the ratio is
//! the cost of the stage, not of the size; each is the median of three rounds that alternate
//! the configurations.
use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use zero::{EngineConfig, ZeroStage};
use zero_benches::size::parse_size;
use zero_gpt::{init_unit, Gpt, GptConfig, ParamLayout, Rng};
use zero_train::bridge::{
    activation_arena_bytes, arena_activations, gpt_engine, kept_inputs, micro_step,
    ActivationPlacement,
};
use zero_train::cli::validate::{MAX_LAYERS_OR_HEADS, MAX_RANKS, MAX_WIDTH};
use zero_train::plan::memory_fit::MemoryQuery;

/// The largest GPT each ZeRO stage trains under a per-rank memory cap (fp32, local ranks;
/// sizes in bytes with K/M/G = powers of 1024).
#[derive(Debug, Parser)]
#[command(name = "zero-bench-memory", version)]
// A flag given twice takes its last value.
#[command(args_override_self = true)]
struct Args {
    /// Data-parallel ranks (threads of this process).
    #[arg(long, default_value_t = 8)]
    ranks: usize,
    /// Cap on each rank's arena.
    #[arg(long, default_value = "512M", value_parser = parse_size, allow_negative_numbers = true)]
    memory_limit: u64,
    /// Tokens per sequence (T).
    #[arg(long, default_value_t = 64)]
    seq_len: usize,
    /// Sequences per rank per micro-step (B).
    #[arg(long, default_value_t = 1)]
    micro_batch: usize,
    /// Vocabulary size V.
    #[arg(long, default_value_t = 8192)]
    vocab: usize,
    /// Width C of the layer search (heads: C/64).
    #[arg(long, default_value_t = 256)]
    width: usize,
    /// Layers L of the width search.
    #[arg(long, default_value_t = 4)]
    layers: usize,
    /// Steps timed per configuration and round, after one warm-up step; the step time is
    /// their median (several for models whose step takes milliseconds).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..))]
    timed_steps: u16,
    /// Plan only: skip the confirming runs and step times.
    #[arg(long)]
    plan_only: bool,
    /// ZeRO-Offload: the optimizer states in a host arena of their own; the cap is the
    /// rank's arena only, and a column gives the host arena's peak.
    #[arg(long)]
    offload_optimizer: bool,
    /// With `--offload-optimizer`: the kept gradients in that host arena too
    /// (`zero-train --offload-gradients`).
    #[arg(long, requires = "offload_optimizer")]
    offload_gradients: bool,
}

/// One search result.
struct Row {
    stage: ZeroStage,
    every: Option<usize>,
    model: GptConfig,
    peak: Option<Peaks>,
    step_ratio: Option<f64>,
}

/// Rank 0's peaks over two steps: its arena, and the offloaded optimizer's host arena (0
/// without offload).
#[derive(Clone, Copy)]
struct Peaks {
    arena: u64,
    host: u64,
}

/// The searched model, or `None` past zero-train's limits (which bound every search).
fn gpt(args: &Args, layers: usize, width: usize) -> Option<GptConfig> {
    if layers > MAX_LAYERS_OR_HEADS || width > MAX_WIDTH {
        return None;
    }
    GptConfig::new(args.seq_len, args.vocab, layers, (width / 64).max(1), width).ok()
}

fn params(model: &GptConfig) -> usize {
    ParamLayout::new(model).num_params()
}

/// The engine's defaults (fp32, 4 MiB buckets, one unit prefetched) at `stage`, the optimizer
/// offloaded as asked: what both the search's plans and the measured runs build.
fn engine_config(args: &Args, stage: ZeroStage) -> EngineConfig {
    EngineConfig {
        stage,
        offload_optimizer: args.offload_optimizer,
        offload_gradients: args.offload_gradients,
        ..EngineConfig::default()
    }
}

fn fits(args: &Args, model: &GptConfig, stage: ZeroStage, every: Option<usize>) -> bool {
    let query = MemoryQuery {
        model: *model,
        micro_batch: args.micro_batch,
        seq_len: args.seq_len,
        placement: ActivationPlacement {
            checkpoint_every: every,
            offload: false,
            backend_scratch: 0, // the CPU backend's
            partitions: 1,
        },
        // The local backend's ranks: it stages nothing.
        shape: engine_config(args, stage).plan_shape(args.ranks, zero_comm::StagingRule::None),
        tensor_parallel: 1,
    };
    query
        .plan()
        .is_ok_and(|plan| plan.total() <= args.memory_limit)
}

/// The largest `x >= lo` with `ok(x)`, by doubling then bisection; `None` if not even `lo`.
/// A doubling that would overflow stops the search where it is.
fn search(lo: usize, ok: impl Fn(usize) -> bool) -> Option<usize> {
    if !ok(lo) {
        return None;
    }
    let mut good = lo;
    let mut bad = loop {
        match good.checked_mul(2) {
            Some(next) if ok(next) => good = next,
            Some(next) => break next,
            None => return Some(good),
        }
    };
    while bad - good > 1 {
        let mid = good + (bad - good) / 2;
        if ok(mid) {
            good = mid;
        } else {
            bad = mid;
        }
    }
    Some(good)
}

/// Trains `1 + timed_steps` steps on every rank under the cap; rank 0's peaks and the median
/// time of the steps after the first.
fn train(
    args: &Args,
    model: GptConfig,
    stage: ZeroStage,
    every: Option<usize>,
    cap: Option<u64>,
    timed_steps: usize,
) -> Result<(Peaks, f64), String> {
    let (b, t) = (args.micro_batch, args.seq_len);
    let placement = ActivationPlacement {
        checkpoint_every: every,
        offload: false,
        backend_scratch: 0, // the CPU backend's
        partitions: 1,
    };
    let engine_config = EngineConfig {
        memory_limit: cap,
        activation_bytes: activation_arena_bytes(&model, b, t, placement)
            .map_err(|e| e.to_string())?,
        kept_inputs: kept_inputs(&model, b, t, placement).map_err(|e| e.to_string())?,
        ..engine_config(args, stage)
    };
    let comms = zero_comm::local::create(args.ranks).map_err(|e| e.to_string())?;
    let results: Vec<Result<(Peaks, f64), String>> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|comm| {
                s.spawn(move || -> Result<(Peaks, f64), String> {
                    let err = |e: &dyn std::fmt::Display| e.to_string();
                    let gpt = Gpt::new(model).map_err(|e| err(&e))?;
                    let layout = gpt.layout().clone();
                    let mut engine = gpt_engine(comm, &layout, every, engine_config, |unit, w| {
                        // Shapes come from GptConfig::new, which init accepts.
                        let _ = init_unit(&model, &layout, unit, 1, w);
                    })
                    .map_err(|e| err(&e))?;
                    let mut acts = arena_activations(&mut engine, &gpt, b, t, placement)
                        .map_err(|e| err(&e))?;
                    let mut rng = Rng::new(engine.rank() as u64);
                    let mut step_seconds = Vec::new();
                    // The first step warms up (first touch of the arena, rayon's pool).
                    for step in 0..=timed_steps {
                        let seq: Vec<u32> = (0..=b * t)
                            .map(|_| (rng.next_u64() % model.vocab_size as u64) as u32)
                            .collect();
                        let start = Instant::now();
                        micro_step(&mut engine, &gpt, &mut acts, &seq[..b * t], &seq[1..])
                            .map_err(|e| err(&e))?;
                        engine.step(1e-4).map_err(|e| err(&e))?;
                        if step > 0 {
                            step_seconds.push(start.elapsed().as_secs_f64());
                        }
                    }
                    let seconds = median(&mut step_seconds).unwrap_or(0.0);
                    let peak = |a: &zero_alloc::Arena| a.stats().peak_allocated as u64;
                    let peaks = Peaks {
                        arena: peak(engine.arena()),
                        host: engine.offload_arena().map_or(0, peak),
                    };
                    Ok((peaks, seconds))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a rank panicked".into())))
            .collect()
    });
    results.into_iter().next().unwrap_or(Err("no ranks".into()))
}

/// The largest model along `grow` (layers or width in units of 64) that trains.
fn largest(
    args: &Args,
    stage: ZeroStage,
    every: Option<usize>,
    shape: impl Fn(usize) -> Option<GptConfig>,
) -> Option<(GptConfig, Option<Peaks>)> {
    let ok = |x: usize| shape(x).is_some_and(|m| fits(args, &m, stage, every));
    let mut x = search(1, ok)?;
    while x >= 1 {
        let model = shape(x)?;
        if args.plan_only {
            return Some((model, None));
        }
        match train(args, model, stage, every, Some(args.memory_limit), 1) {
            Ok((peak, _)) => return Some((model, Some(peak))),
            Err(e) => eprintln!("{stage} at {x}: {e}; stepping down"),
        }
        x -= 1;
    }
    None
}

fn table(args: &Args, title: &str, shape: impl Fn(usize) -> Option<GptConfig> + Copy) {
    let mut rows = Vec::new();
    for stage in ZeroStage::ALL {
        for every in [None, Some(1)] {
            if let Some((model, peak)) = largest(args, stage, every, shape) {
                rows.push(Row {
                    stage,
                    every,
                    model,
                    peak,
                    step_ratio: None,
                });
            }
        }
    }
    let base = rows.first().map(|r| r.model);
    if let (Some(base), false) = (base, args.plan_only) {
        step_ratios(args, base, &mut rows);
    }
    print_rows(args, title, &rows);
}

/// Rounds of step timings; each configuration's median is kept.
const TIMING_ROUNDS: usize = 3;

/// Each row's step time on `base` against stage 0's without checkpointing. Every round times
/// stage 0 and each row one after the other, so slow spells of a shared machine fall on all
/// of them; the ratio is of the medians over the rounds.
fn step_ratios(args: &Args, base: GptConfig, rows: &mut [Row]) {
    let time = |stage, every| {
        train(args, base, stage, every, None, args.timed_steps.into())
            .ok()
            .map(|r| r.1)
    };
    let mut t0 = Vec::new();
    let mut times = vec![Vec::new(); rows.len()];
    for _ in 0..TIMING_ROUNDS {
        t0.extend(time(ZeroStage::Zero0, None));
        for (row, seen) in rows.iter().zip(&mut times) {
            seen.extend(time(row.stage, row.every));
        }
    }
    let t0 = median(&mut t0);
    for (row, seen) in rows.iter_mut().zip(&mut times) {
        row.step_ratio = t0.zip(median(seen)).map(|(a, b)| b / a);
    }
}

/// The median of `xs` (the upper one of an even count), `None` when empty.
fn median(xs: &mut [f64]) -> Option<f64> {
    xs.sort_by(f64::total_cmp);
    xs.get(xs.len() / 2).copied()
}

/// Why `args` cannot run, naming the first flag out of range.
fn refusal(args: &Args) -> Option<String> {
    let ranges = [
        ("--ranks", args.ranks, MAX_RANKS),
        ("--layers", args.layers, MAX_LAYERS_OR_HEADS),
        ("--width", args.width, MAX_WIDTH),
        ("--seq-len", args.seq_len, MAX_WIDTH),
        ("--micro-batch", args.micro_batch, MAX_WIDTH),
        ("--vocab", args.vocab, MAX_WIDTH),
    ];
    for (flag, value, hi) in ranges {
        if !(1..=hi).contains(&value) {
            return Some(format!("{flag} {value}: expected 1 to {hi}"));
        }
    }
    (args.width % 64 != 0).then(|| format!("--width {}: expected a multiple of 64", args.width))
}

fn print_rows(args: &Args, title: &str, rows: &[Row]) {
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    println!("# {title}");
    if rows.is_empty() {
        println!("nothing fits the cap: not even the smallest model of this search, at any stage");
    }
    let host_column = if args.offload_optimizer {
        " | offloaded host arena peak/rank (MiB)"
    } else {
        ""
    };
    println!(
        "stage | checkpointing | L | C | parameters | vs stage 0 | peak/rank (MiB) | step time vs stage 0{host_column}"
    );
    let p0 = rows.first().map_or(1, |r| params(&r.model)) as f64;
    for r in rows {
        let p = params(&r.model);
        let host = match (args.offload_optimizer, r.peak) {
            (false, _) => String::new(),
            (true, None) => " | -".into(),
            (true, Some(p)) => format!(" | {:.1}", mib(p.host)),
        };
        println!(
            "{} | {} | {} | {} | {:.2}M | {:.1}x | {} | {}{host}",
            r.stage as u8,
            if r.every.is_some() { "on" } else { "off" },
            r.model.num_layers,
            r.model.channels,
            p as f64 / 1e6,
            p as f64 / p0,
            r.peak
                .map_or("-".into(), |b| format!("{:.1}", mib(b.arena))),
            r.step_ratio.map_or("-".into(), |x| format!("{x:.2}x")),
        );
    }
    if rows
        .iter()
        .any(|r| r.model.num_layers == MAX_LAYERS_OR_HEADS || r.model.channels + 64 > MAX_WIDTH)
    {
        println!(
            "# rows at L={MAX_LAYERS_OR_HEADS} or C near {MAX_WIDTH} stopped at zero-train's \
             limits, not at the cap"
        );
    }
    println!(
        "# N_d={} cap {:.0} MiB/rank{}, fp32, T={} B={} V={}\n",
        args.ranks,
        mib(args.memory_limit),
        match (args.offload_optimizer, args.offload_gradients) {
            (true, true) => " (arena only: optimizer states and gradients offloaded)",
            (true, false) => " (arena only: optimizer states offloaded)",
            _ => "",
        },
        args.seq_len,
        args.micro_batch,
        args.vocab
    );
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(why) = refusal(&args) {
        eprintln!("zero-bench-memory: {why}");
        return ExitCode::FAILURE;
    }
    let width = args.width;
    let layers = args.layers;
    table(&args, &format!("layers at C={width}"), |l| {
        gpt(&args, l, width)
    });
    table(&args, &format!("width at L={layers}"), |w| {
        gpt(&args, layers, 64 * w)
    });
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::search;

    #[test]
    fn search_finds_the_last_x_a_linear_scan_accepts() {
        for limit in [1_usize, 2, 3, 7, 8, 9, 100, 1023, 1024, 1025] {
            let linear = (1..=4096).take_while(|&x| x <= limit).last();
            assert_eq!(search(1, |x| x <= limit), linear, "limit {limit}");
        }
        assert_eq!(search(1, |_| false), None);
    }

    #[test]
    fn the_median_is_the_middle_value() {
        assert_eq!(super::median(&mut [3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(super::median(&mut [4.0, 1.0]), Some(4.0));
        assert_eq!(super::median(&mut []), None);
    }

    #[test]
    fn a_search_that_never_fails_stops_before_overflowing() {
        assert_eq!(search(1, |_| true), Some(1 << (usize::BITS - 1)));
    }
}
