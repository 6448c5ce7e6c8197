//! `zero-bench`: an nccl-tests-style collective benchmark.
//!
//! ```text
//! zero-bench all_reduce -b 8 -e 256M -f 4 -n 20 -w 5 -c 1 -d float -o sum --ranks 2
//! ```
//! prints the machine's memcpy bandwidth first, then nccl-tests' table (out-of-place, then
//! in-place) with one extra column, `membw`: the bytes the local algorithm read and wrote in
//! memory per second, comparable with the memcpy line (NaN on MPI, TCP and NCCL).
//!
//! `--backend mpi`, `--backend tcp` and `--backend nccl` run one rank per process: under
//! `mpirun` (MPI, NCCL), or (TCP, NCCL) with torchrun's `RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
//! `MASTER_ADDR`, `MASTER_PORT` set.
use std::process::ExitCode;

use clap::{Parser, ValueEnum};
use zero::MAX_RANKS;
use zero_alloc::{host_available_bytes, host_memory_override, HOST_MEMORY_VAR};
use zero_benches::collective::{bus_factor, run, run_on, BenchConfig, Measurement, Row};
use zero_benches::memcpy::memcpy_bandwidth;
use zero_benches::size::parse_size;
use zero_comm::{DType, OpKind, ReduceOp};

#[derive(Debug, Clone, Copy, ValueEnum)]
#[value(rename_all = "snake_case")]
enum Op {
    AllReduce,
    ReduceScatter,
    AllGather,
    Broadcast,
    Reduce,
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
enum Backend {
    Local,
    Mpi,
    /// One process per rank over TCP (zero-comm's `tcp`), with torchrun's variables.
    Tcp,
    Nccl,
}

/// Where the local backend's buffers live.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
enum Device {
    /// Host memory.
    Cpu,
    /// GPU 0, shared by every rank (zero-comm's device-local backend; feature `cuda`).
    Cuda,
}

/// Collective benchmark in the style of nccl-tests (sizes in bytes, K/M/G = powers of 1024;
/// bandwidths in decimal GB/s).
#[derive(Debug, Parser)]
#[command(name = "zero-bench", version)]
// A flag given twice takes its last value (nccl-tests and GNU tools do the same).
#[command(args_override_self = true)]
struct Args {
    /// The collective.
    op: Op,
    /// Minimum size in bytes.
    #[arg(short = 'b', long = "minbytes", default_value = "32M", value_parser = parse_size, allow_negative_numbers = true)]
    min_bytes: u64,
    /// Maximum size in bytes.
    #[arg(short = 'e', long = "maxbytes", default_value = "32M", value_parser = parse_size, allow_negative_numbers = true)]
    max_bytes: u64,
    /// Multiplication factor between sizes.
    #[arg(short = 'f', long = "stepfactor", default_value_t = 2)]
    factor: u64,
    /// Timed iterations per size.
    #[arg(short = 'n', long = "iters", default_value_t = 20)]
    iters: usize,
    /// Warm-up iterations per size.
    #[arg(short = 'w', long = "warmup_iters", default_value_t = 5)]
    warmup: usize,
    /// Check results (0/1).
    #[arg(short = 'c', long = "check", default_value_t = 1)]
    check: u8,
    /// Element type: float, bfloat16, half, int32, int64, double (or f32, bf16, f16, i32,
    /// i64, f64). Integers have no avg.
    #[arg(short = 'd', long = "datatype", default_value = "float")]
    dtype: String,
    /// Reduction: sum, avg, max, min.
    #[arg(short = 'o', long = "op", default_value = "sum")]
    redop: String,
    /// Root rank for broadcast and reduce.
    #[arg(short = 'r', long = "root", default_value_t = 0)]
    root: usize,
    /// Number of ranks (threads) on the local backend.
    #[arg(long, default_value_t = 2)]
    ranks: usize,
    /// GPUs per thread (nccl-tests' -g): 1 only; more GPUs are more processes (mpirun or
    /// torchrun's variables with --backend nccl).
    #[arg(short = 'g', long = "ngpus", default_value_t = 1)]
    ngpus: usize,
    /// Threads per process (nccl-tests' -t): 1 only (the local backend's threads are --ranks).
    #[arg(short = 't', long = "nthreads", default_value_t = 1)]
    nthreads: usize,
    /// Backend.
    #[arg(long, value_enum, default_value = "local")]
    backend: Backend,
    /// Where the local backend's ranks keep their buffers (`cuda`: threads sharing GPU 0).
    #[arg(long, value_enum, default_value = "cpu")]
    device: Device,
    /// One JSON object per size instead of the table.
    #[arg(long)]
    json: bool,
    /// Skip the memcpy baseline line.
    #[arg(long)]
    no_memcpy: bool,
}

fn config(a: &Args) -> Result<BenchConfig, String> {
    let op = match a.op {
        Op::AllReduce => OpKind::AllReduce,
        Op::ReduceScatter => OpKind::ReduceScatter,
        Op::AllGather => OpKind::AllGather,
        Op::Broadcast => OpKind::Broadcast,
        Op::Reduce => OpKind::Reduce,
    };
    let dtype = DType::parse(&a.dtype).ok_or_else(|| {
        format!(
            "-d {:?}: unknown datatype (float, bfloat16, half, int32, int64 or double; also f32, bf16, f16, i32, i64, f64)",
            a.dtype
        )
    })?;
    let redop = ReduceOp::parse(&a.redop)
        .ok_or_else(|| format!("-o {:?}: unknown reduction (sum, avg, max or min)", a.redop))?;
    backend_available(a.backend)?;
    if let Some(why) = refusal(a) {
        return Err(why);
    }
    if a.root >= a.ranks {
        return Err(format!(
            "root {} is not a rank of {} ranks",
            a.root, a.ranks
        ));
    }
    Ok(BenchConfig {
        op,
        min_bytes: a.min_bytes,
        max_bytes: a.max_bytes,
        factor: a.factor,
        iters: a.iters,
        warmup: a.warmup,
        check: a.check == 1,
        dtype,
        redop,
        root: a.root,
        ranks: a.ranks,
    })
}

/// Refuses a backend this build lacks.
fn backend_available(backend: Backend) -> Result<(), String> {
    match backend {
        Backend::Mpi if !cfg!(feature = "mpi") => {
            Err("--backend mpi needs a build with --features mpi (launch with mpirun)".into())
        }
        Backend::Nccl if !cfg!(feature = "cuda") => Err(
            "--backend nccl needs a build with --features cuda (one process per GPU, launched \
             by mpirun or with torchrun's variables)"
                .into(),
        ),
        Backend::Local | Backend::Tcp | Backend::Mpi | Backend::Nccl => Ok(()),
    }
}

/// Why the sizes, counts and launch flags are refused, if they are (the first reason).
fn refusal(a: &Args) -> Option<String> {
    let refusals = [
        (
            a.ranks == 0 || a.ranks > MAX_RANKS,
            format!("--ranks {}: expected 1 to {MAX_RANKS}", a.ranks),
        ),
        (
            a.min_bytes > a.max_bytes,
            format!(
                "-b {} is above -e {}: the sizes run from -b up to -e",
                a.min_bytes, a.max_bytes
            ),
        ),
        (a.factor == 0, "-f must be at least 1".to_string()),
        (
            a.iters == 0,
            "-n must be at least 1 (a time per iteration needs one timed iteration)".to_string(),
        ),
        (a.check > 1, format!("-c is 0 or 1, not {}", a.check)),
        (
            a.ngpus != 1,
            format!(
                "-g {}: one GPU per process here; run one process per GPU (mpirun, or \
                 torchrun's variables with --backend nccl)",
                a.ngpus
            ),
        ),
        (
            a.nthreads != 1,
            format!(
                "-t {}: one thread per process here (the local backend's ranks are --ranks)",
                a.nthreads
            ),
        ),
    ];
    refusals
        .into_iter()
        .find(|(bad, _)| *bad)
        .map(|(_, why)| why)
}

fn has_redop(op: OpKind) -> bool {
    matches!(
        op,
        OpKind::AllReduce | OpKind::ReduceScatter | OpKind::Reduce
    )
}

fn cells(m: &Measurement) -> String {
    let wrong = m.wrong.map_or_else(|| "N/A".to_string(), |w| w.to_string());
    format!(
        "{:>9.1} {:>7.2} {:>7.2} {:>7.2} {:>6}",
        m.time_us, m.algbw, m.busbw, m.membw, wrong
    )
}

fn json_cells(m: &Measurement) -> serde_json::Value {
    serde_json::json!({
        "time_us": m.time_us, "algbw": m.algbw, "busbw": m.busbw, "membw": m.membw, "wrong": m.wrong,
    })
}

/// This process's communicator under a launcher (`--backend mpi`, `--backend tcp`; `None` on
/// the local backend, whose ranks are threads of `--ranks`), and what must outlive it (MPI's
/// initialisation).
type World = Option<(Box<dyn std::any::Any>, zero_comm::Communicator)>;

fn world(args: &mut Args) -> Result<World, String> {
    let world = match args.backend {
        Backend::Tcp => {
            let comm = zero_comm::tcp::from_env(zero_comm::Config::default())
                .map_err(|e| format!("--backend tcp (launch with torchrun's variables): {e}"))?;
            (Box::new(()) as Box<dyn std::any::Any>, comm)
        }
        Backend::Mpi => mpi_world()?,
        Backend::Local | Backend::Nccl => return Ok(None),
    };
    args.ranks = world.1.size();
    Ok(Some(world))
}

#[cfg(feature = "mpi")]
fn mpi_world() -> Result<(Box<dyn std::any::Any>, zero_comm::Communicator), String> {
    let mpi = zero_comm::mpi::Mpi::init().map_err(|e| e.to_string())?;
    let comm = mpi
        .world(zero_comm::Config::default())
        .map_err(|e| e.to_string())?;
    Ok((Box::new(mpi), comm))
}

#[cfg(not(feature = "mpi"))]
fn mpi_world() -> Result<(Box<dyn std::any::Any>, zero_comm::Communicator), String> {
    Err("--backend mpi needs a build with --features mpi (launch with mpirun)".into())
}

/// nccl-tests' table: header, one line per size, closing lines. Only rank 0 prints.
struct Table {
    json: bool,
    leader: bool,
    cfg: BenchConfig,
    redop: &'static str,
    root: i64,
    busbw_sum: f64,
    rows: usize,
    wrong_total: u64,
}

impl Table {
    fn new(cfg: BenchConfig, json: bool, leader: bool) -> Self {
        let redop = if has_redop(cfg.op) {
            cfg.redop.name()
        } else {
            "none"
        };
        let root = if matches!(cfg.op, OpKind::Broadcast | OpKind::Reduce) {
            cfg.root as i64
        } else {
            -1
        };
        Table {
            json,
            leader,
            cfg,
            redop,
            root,
            busbw_sum: 0.0,
            rows: 0,
            wrong_total: 0,
        }
    }

    fn header(&self, backend: &str, memcpy: Option<(usize, f64)>) {
        let cfg = &self.cfg;
        if self.json {
            if let Some((bytes, gbs)) = memcpy {
                let v = serde_json::json!({"memcpy": {"threads": cfg.ranks, "bytes": bytes, "gbps": gbs}});
                println!("{v}");
            }
            return;
        }
        if !self.leader {
            return;
        }
        println!(
            "# zero-bench {}: {} ranks, {backend} backend, {} {}",
            cfg.op, cfg.ranks, cfg.dtype, self.redop
        );
        println!("# busbw factor {:.3}; membw = bytes read + written by the algorithm (all ranks) / time", bus_factor(cfg.op, cfg.ranks));
        if let Some((bytes, gbs)) = memcpy {
            println!(
                "# memcpy baseline: {} threads x {bytes} B, read + written / time: {gbs:.2} GB/s",
                cfg.ranks
            );
        }
        println!("#");
        println!("#{:>59}{:>43}{:>37}", "", "out-of-place", "in-place");
        println!(
            "#{:>11} {:>13} {:>9} {:>7} {:>6}  {:>9} {:>7} {:>7} {:>7} {:>6}  {:>9} {:>7} {:>7} {:>7} {:>6}",
            "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "membw", "#wrong", "time", "algbw", "busbw", "membw", "#wrong"
        );
        println!(
            "#{:>11} {:>13} {:>9} {:>7} {:>6}  {:>9} {:>7} {:>7} {:>7} {:>6}  {:>9} {:>7} {:>7} {:>7} {:>6}",
            "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "(GB/s)", ""
        );
    }

    fn row(&mut self, row: &Row) {
        self.busbw_sum += (row.out_of_place.busbw + row.in_place.busbw) / 2.0;
        self.rows += 1;
        self.wrong_total += row.out_of_place.wrong.unwrap_or(0) + row.in_place.wrong.unwrap_or(0);
        let (cfg, redop, root) = (&self.cfg, self.redop, self.root);
        if self.json {
            let v = serde_json::json!({
                "op": cfg.op.name(), "ranks": cfg.ranks, "size": row.size, "count": row.count,
                "type": cfg.dtype.name(), "redop": redop, "root": root,
                "out_of_place": json_cells(&row.out_of_place), "in_place": json_cells(&row.in_place),
            });
            println!("{v}");
        } else {
            println!(
                " {:>11} {:>13} {:>9} {:>7} {:>6}  {}  {}",
                row.size,
                row.count,
                cfg.dtype.name(),
                redop,
                root,
                cells(&row.out_of_place),
                cells(&row.in_place)
            );
        }
    }

    fn footer(&self) -> ExitCode {
        let wrong_total = self.wrong_total;
        if !self.json && self.leader {
            println!(
                "# Out of bounds values : {wrong_total} {}",
                if wrong_total == 0 { "OK" } else { "FAILED" }
            );
            println!(
                "# Avg bus bandwidth    : {:.4}",
                self.busbw_sum / self.rows.max(1) as f64
            );
        }
        if wrong_total == 0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        }
    }
}

fn fail(e: impl std::fmt::Display, code: u8) -> ExitCode {
    eprintln!("zero-bench: {e}");
    ExitCode::from(code)
}

fn main() -> ExitCode {
    let mut args = Args::parse();
    if args.backend == Backend::Nccl {
        return nccl_main(args);
    }
    if args.device == Device::Cuda {
        return device_local_main(&args);
    }
    let world = match world(&mut args) {
        Ok(w) => w,
        Err(e) => return fail(e, 1),
    };
    // Under mpirun only rank 0 prints (report() is only called there, too).
    let leader = world.as_ref().is_none_or(|(_, c)| c.rank() == 0);
    let backend = world.as_ref().map_or("local", |(_, c)| c.backend());
    let cfg = match config(&args) {
        Ok(c) => c,
        Err(e) => return fail(e, 2),
    };
    let ranks_here = if world.is_none() { cfg.ranks } else { 1 };
    if let Err(e) = host_memory_override() {
        return fail(format!("{HOST_MEMORY_VAR}: {e}"), 2);
    }
    if let Err(e) = fits_host(&cfg, ranks_here, host_available_bytes()) {
        return fail(e, 2);
    }
    let memcpy = (!args.no_memcpy && world.is_none()).then(|| {
        let bytes = usize::try_from(cfg.max_bytes)
            .unwrap_or(usize::MAX)
            .max(1 << 20);
        let gbs = memcpy_bandwidth(cfg.ranks, bytes, cfg.iters.max(1));
        (bytes, gbs)
    });
    let mut table = Table::new(cfg.clone(), args.json, leader);
    table.header(backend, memcpy);
    let result = match &world {
        Some((_, comm)) => run_on(&cfg, comm, &mut |r: &Row| table.row(r)),
        None => run(&cfg, &mut |r: &Row| table.row(r)),
    };
    if let Err(e) = result {
        return fail(e, 1);
    }
    table.footer()
}

/// Refuses a run whose host buffers (a send and a receive buffer of `-e` bytes for each of
/// `ranks_here` ranks) need more than the machine's `available` memory (unknown: no check),
/// before any is allocated.
fn fits_host(cfg: &BenchConfig, ranks_here: usize, available: Option<u64>) -> Result<(), String> {
    let Some(available) = available else {
        return Ok(());
    };
    let ranks = u64::try_from(ranks_here).unwrap_or(u64::MAX);
    let needed = cfg.max_bytes.saturating_mul(2).saturating_mul(ranks);
    if needed <= available {
        return Ok(());
    }
    Err(format!(
        "-e {} needs {} of host memory (a send and a receive buffer for each of {ranks_here} \
         rank(s)), more than the {} this machine has available: lower -e",
        cfg.max_bytes,
        zero_alloc::human_bytes(needed),
        zero_alloc::human_bytes(available)
    ))
}

/// This process's NCCL rank: torchrun's variables when `RANK` is set, else MPI's world
/// (the `Mpi` value is kept alive beside the communicator).
#[cfg(feature = "cuda")]
fn nccl_comm() -> Result<(Box<dyn std::any::Any>, zero_comm::nccl::NcclComm), String> {
    use zero_comm::nccl::NcclComm;
    let config = zero_comm::Config::default();
    if std::env::var_os("RANK").is_some() {
        let comm = NcclComm::from_env(config).map_err(|e| e.to_string())?;
        return Ok((Box::new(()), comm));
    }
    #[cfg(feature = "mpi")]
    {
        let mpi = zero_comm::mpi::Mpi::init().map_err(|e| e.to_string())?;
        let comm = NcclComm::from_mpi(&mpi, config).map_err(|e| e.to_string())?;
        Ok((Box::new(mpi), comm))
    }
    #[cfg(not(feature = "mpi"))]
    Err(
        "--backend nccl: set RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT (as \
         torchrun does), or build with --features cuda,mpi and launch with mpirun"
            .into(),
    )
}

#[cfg(feature = "cuda")]
fn nccl_main(mut args: Args) -> ExitCode {
    let (_keep, comm) = match nccl_comm() {
        Ok(c) => c,
        Err(e) => return fail(e, 1),
    };
    args.ranks = comm.size();
    let cfg = match config(&args) {
        Ok(c) => c,
        Err(e) => return fail(e, 2),
    };
    let mut table = Table::new(cfg.clone(), args.json, comm.rank() == 0);
    table.header("nccl", None);
    if let Err(e) = zero_benches::nccl::run_nccl(&cfg, &comm, &mut |r: &Row| table.row(r)) {
        return fail(e, 1);
    }
    table.footer()
}

/// `--backend local --device cuda`: the device-local backend on GPU 0.
#[cfg(feature = "cuda")]
fn device_local_main(args: &Args) -> ExitCode {
    if args.backend != Backend::Local {
        return fail(
            "--device cuda goes with --backend local (nccl is on the GPU already)",
            2,
        );
    }
    let cfg = match config(args) {
        Ok(c) => c,
        Err(e) => return fail(e, 2),
    };
    let mut table = Table::new(cfg.clone(), args.json, true);
    table.header("device-local (GPU 0)", None);
    let run = zero_benches::device_local::run_device_local(&cfg, &mut |r: &Row| table.row(r));
    if let Err(e) = run {
        return fail(e, 1);
    }
    table.footer()
}

#[cfg(not(feature = "cuda"))]
fn device_local_main(args: &Args) -> ExitCode {
    match config(args) {
        Ok(_) => fail("--device cuda needs a build with --features cuda", 2),
        Err(e) => fail(e, 2),
    }
}

#[cfg(not(feature = "cuda"))]
fn nccl_main(args: Args) -> ExitCode {
    match config(&args) {
        Ok(_) => fail("--backend nccl is not in this build", 2),
        Err(e) => fail(e, 2),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(flags: &[&str]) -> String {
        let argv = ["zero-bench", "all_reduce"].iter().chain(flags);
        let args = Args::try_parse_from(argv).expect("flags parse");
        config(&args).expect_err("refused")
    }

    #[test]
    fn each_impossible_flag_is_refused_by_name() {
        assert!(refusal(&["-n", "0"]).starts_with("-n must be"));
        assert!(refusal(&["-d", "int8"]).starts_with("-d \"int8\": unknown datatype (float"));
        assert!(refusal(&["-o", "prod"]).starts_with("-o \"prod\": unknown reduction (sum"));
        assert!(refusal(&["-b", "64K", "-e", "1K"]).contains("-b 65536 is above -e 1024"));
        assert!(refusal(&["-f", "0"]).starts_with("-f must be"));
        assert!(refusal(&["-c", "2"]).starts_with("-c is 0 or 1"));
        assert!(refusal(&["--ranks", "0"]).starts_with("--ranks 0: expected 1 to 1024"));
        assert!(refusal(&["--ranks", "1025"]).starts_with("--ranks 1025: expected 1 to 1024"));
        assert!(refusal(&["--ranks", "2", "-r", "2"]).contains("root 2 is not a rank of 2"));
        assert!(refusal(&["-g", "8"]).starts_with("-g 8: one GPU per process"));
        assert!(refusal(&["-t", "2"]).starts_with("-t 2: one thread per process"));
    }

    #[test]
    fn buffers_larger_than_the_machine_are_refused_before_allocating() {
        let args = Args::try_parse_from(["zero-bench", "all_reduce", "-e", "1G"]).expect("parse");
        let cfg = config(&args).expect("valid");
        // 2 ranks x 2 buffers x 1 GiB = 4 GiB.
        assert!(fits_host(&cfg, 2, Some(4 << 30)).is_ok());
        let why = fits_host(&cfg, 2, Some((4 << 30) - 1)).expect_err("refused");
        assert!(why.starts_with("-e 1073741824 needs 4.00 GiB"), "{why}");
        assert!(fits_host(&cfg, usize::MAX, Some(u64::MAX - 1)).is_err());
        assert!(fits_host(&cfg, 2, None).is_ok());
    }

    #[test]
    fn nccl_tests_defaults_are_accepted() {
        let args = Args::try_parse_from(["zero-bench", "all_reduce", "-g", "1", "-t", "1"])
            .expect("parse");
        let cfg = config(&args).expect("valid");
        assert_eq!(
            (cfg.min_bytes, cfg.max_bytes, cfg.iters),
            (32 << 20, 32 << 20, 20)
        );
    }
}
