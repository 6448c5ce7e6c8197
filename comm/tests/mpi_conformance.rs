//! The conformance suite on the MPI backend, one process per rank:
//! `mpirun -np 4 target/debug/deps/mpi_conformance-*` (scripts/test.sh finds the binary).
//! Without mpirun it runs as one rank.
//!
//! Every rank runs every case; after each, the ranks agree on the outcome (an all-reduce of
//! failure flags), rank 0 prints one line per case and `N passed, M failed`, and every rank
//! exits non-zero when a case failed. Then MPI-only cases: timeouts, mismatch detection, the
//! bootstrap helpers, the native algorithm and staging in a lent arena block. Optional
//! arguments filter cases by substring.

#[macro_use]
mod conformance;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use conformance::{Failure, Result};
use zero_comm::mpi::{Algorithm, Mpi};
use zero_comm::{BreakCause, CommError, Communicator, Config, OpKind, ReduceOp};

/// Generous: a case that hangs fails after this instead of hanging CI (which also wraps
/// mpirun in `timeout`).
const CASE_TIMEOUT: Duration = Duration::from_secs(60);

/// A rank that skips a collective: its peers time out naming the collective, and the
/// communicator reports itself broken afterwards.
fn mpi_timeout_names_the_collective(mpi: &Mpi) -> Result {
    let c = mpi.world(Config::with_timeout(Duration::from_millis(500)))?;
    let (n, r) = (c.size(), c.rank());
    if n == 1 {
        return Ok(());
    }
    c.barrier()?; // seq 0
    if r == n - 1 {
        // Late past the timeout, then it joins (and times out in the second phase).
        std::thread::sleep(Duration::from_millis(1500));
    }
    let mut x = vec![1.0f32; 10];
    let e = c.all_reduce_in_place(&mut x, ReduceOp::Sum);
    let after = c.barrier();
    let Err(CommError::Timeout { op, seq, bytes, .. }) = &e else {
        return Err(Failure(format!("rank {r}: want a timeout, got {e:?}")));
    };
    ensure!(
        (*op, *seq, *bytes) == (OpKind::AllReduce, 1, 40),
        "timeout names {op} #{seq} ({bytes} bytes)"
    );
    let msg = e.as_ref().map_err(ToString::to_string).unwrap_err();
    ensure!(msg.contains("all_reduce #1"), "message: {msg}");
    ensure!(
        matches!(
            after,
            Err(CommError::Broken {
                cause: BreakCause::TimedOut { seq: 1, .. },
                ..
            })
        ),
        "after a timeout: {after:?}"
    );
    Ok(())
}

/// With `debug_checks`, ranks that disagree on a collective all get the same mismatch error.
fn mpi_mismatch_is_reported_on_every_rank(mpi: &Mpi) -> Result {
    let config = Config {
        debug_checks: true,
        ..Config::with_timeout(CASE_TIMEOUT)
    };
    let c = mpi.world(config)?;
    let (n, r) = (c.size(), c.rank());
    if n == 1 {
        return Ok(());
    }
    let mut x = vec![0f32; if r == n - 1 { 6 } else { 4 }];
    let e = c.all_reduce_in_place(&mut x, ReduceOp::Sum);
    let after = c.barrier();
    ensure!(
        matches!(
            e,
            Err(CommError::Mismatch {
                field: "count",
                seq: 0,
                ..
            })
        ),
        "rank {r}: {e:?}"
    );
    ensure!(
        matches!(after, Err(CommError::Broken { .. })),
        "after: {after:?}"
    );
    Ok(())
}

/// The NCCL bootstrap: a 128-byte id from rank 0 reaches every rank; the local rank is the
/// rank on one machine.
fn mpi_bootstrap_helpers(mpi: &Mpi) -> Result {
    let mut id = [0u8; 128];
    if mpi.rank() == 0 {
        id.iter_mut()
            .enumerate()
            .for_each(|(i, b)| *b = (i * 7 + 3) as u8);
    }
    mpi.broadcast_id(&mut id, 0, CASE_TIMEOUT)?;
    let (local, local_size) = mpi.local_rank()?;
    let bad_root = mpi.broadcast_id(&mut id, mpi.size(), CASE_TIMEOUT);
    ensure!(
        id.iter().enumerate().all(|(i, &b)| b == (i * 7 + 3) as u8),
        "id not broadcast"
    );
    // CI runs every rank on one machine.
    ensure!(
        (local, local_size) == (mpi.rank(), mpi.size()),
        "local rank {local} of {local_size}"
    );
    ensure!(
        matches!(bad_root, Err(CommError::Root { .. })),
        "{bad_root:?}"
    );
    Ok(())
}

/// `Algorithm::Native` (MPI_Iallreduce) is correct on exactly representable data.
fn mpi_native_all_reduce(mpi: &Mpi) -> Result {
    let c = mpi.world_with(Config::with_timeout(CASE_TIMEOUT), Algorithm::Native)?;
    let n = c.size();
    for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min] {
        let mut x: Vec<f32> = (0..100).map(|i| (i * (c.rank() + 1)) as f32).collect();
        c.all_reduce_in_place(&mut x, op)?;
        let want: Vec<f32> = (0..100)
            .map(|i| {
                let vals = (1..=n).map(|k| (i * k) as f32);
                match op {
                    ReduceOp::Sum => vals.sum(),
                    ReduceOp::Avg => vals.sum::<f32>() / n as f32,
                    ReduceOp::Max => vals.fold(f32::MIN, f32::max),
                    ReduceOp::Min => vals.fold(f32::MAX, f32::min),
                }
            })
            .collect();
        ensure!(x == want, "native {op}: {:?}", &x[..4]);
    }
    Ok(())
}

fn alloc_failure(e: zero_alloc::AllocError) -> conformance::Failure {
    conformance::Failure(format!("arena: {e}"))
}

/// Staging in a block lent from an arena: every collective of at most the provided size
/// (every kind, f32 and bf16, uneven chunks, descriptor checks on) stays inside it and gives
/// the reduced values; one byte-word more grows a heap buffer that is counted.
fn mpi_staging_stays_in_the_lent_block(mpi: &Mpi) -> Result {
    let config = Config {
        debug_checks: true,
        ..Config::with_timeout(CASE_TIMEOUT)
    };
    let c = mpi.world(config)?;
    let (n, r) = (c.size(), c.rank());
    let largest = 400u64; // 100 f32 or 200 bf16
    let bytes = c.staging_bytes(largest).unwrap_or(0);
    ensure!(
        bytes >= 2 * largest,
        "staging of {bytes} bytes for {largest}"
    );
    let mut arena = zero_alloc::Arena::host(1 << 16).map_err(alloc_failure)?;
    let h = arena
        .alloc_elems::<u64>(bytes.div_ceil(8) as usize)
        .map_err(alloc_failure)?;
    let block = arena.lend::<u64>(h).map_err(alloc_failure)?;
    c.provide_staging(block, largest)?;
    ensure!(c.staging_outside_bytes() == 0, "outside after provide");

    let ranks_sum = (n * (n - 1) / 2) as f32;
    let mut x: Vec<f32> = (0..100).map(|i| (i + r) as f32).collect();
    c.all_reduce_in_place(&mut x, ReduceOp::Sum)?;
    let want: Vec<f32> = (0..100).map(|i| (i * n) as f32 + ranks_sum).collect();
    ensure!(x == want, "all_reduce f32: {:?}", &x[..4]);
    let mut h16 = vec![half::bf16::from_f32(r as f32); 200];
    c.all_reduce_in_place(&mut h16, ReduceOp::Sum)?;
    ensure!(
        h16.iter().all(|v| v.to_f32() == ranks_sum),
        "all_reduce bf16"
    );
    let count = 100 / n * n;
    let mut shard = vec![0f32; count / n];
    c.reduce_scatter(&vec![1f32; count], &mut shard, ReduceOp::Sum)?;
    ensure!(shard.iter().all(|&v| v == n as f32), "reduce_scatter");
    let mut all = vec![0f32; count];
    c.all_gather(&vec![r as f32; count / n], &mut all)?;
    let gathered = all.chunks_exact(count / n).enumerate();
    ensure!(
        gathered
            .clone()
            .all(|(j, s)| s.iter().all(|&v| v == j as f32)),
        "all_gather"
    );
    let mut b = vec![r as f32; 100];
    c.broadcast_in_place(&mut b, n - 1)?;
    ensure!(b.iter().all(|&v| v == (n - 1) as f32), "broadcast");
    let mut red = vec![1f32; 100];
    c.reduce_in_place(&mut red, ReduceOp::Sum, 0)?;
    ensure!(r != 0 || red.iter().all(|&v| v == n as f32), "reduce");
    let outside = c.staging_outside_bytes();
    ensure!(outside == 0, "{outside} bytes staged outside the block");

    let mut over = vec![1f32; 102];
    c.all_reduce_in_place(&mut over, ReduceOp::Sum)?;
    ensure!(
        over.iter().all(|&v| v == n as f32),
        "all_reduce past the block"
    );
    let outside = c.staging_outside_bytes();
    ensure!(
        outside >= 408,
        "408 input bytes past the block, {outside} counted"
    );
    Ok(())
}

type MpiCase = fn(&Mpi) -> Result;

const MPI_CASES: &[(&str, MpiCase)] = &[
    (
        "mpi_timeout_names_the_collective",
        mpi_timeout_names_the_collective,
    ),
    (
        "mpi_mismatch_is_reported_on_every_rank",
        mpi_mismatch_is_reported_on_every_rank,
    ),
    ("mpi_bootstrap_helpers", mpi_bootstrap_helpers),
    ("mpi_native_all_reduce", mpi_native_all_reduce),
    (
        "mpi_staging_stays_in_the_lent_block",
        mpi_staging_stays_in_the_lent_block,
    ),
];

fn outcome(r: std::thread::Result<Result>) -> Option<String> {
    match r {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(e.0),
        Err(_) => Some("panicked".into()),
    }
}

/// Runs one case on this rank and agrees with the others on the outcome: `Some(passed)`,
/// or `None` when the ranks cannot even agree (the world communicator broke).
fn run_one(world: &Communicator, name: &str, run: &dyn Fn() -> Result) -> Option<bool> {
    let rank = world.rank();
    let start = Instant::now();
    let failure = outcome(catch_unwind(AssertUnwindSafe(run)));
    if let Some(msg) = &failure {
        eprintln!("rank {rank}: {name}: {msg}");
    }
    let mut flag = [if failure.is_some() { 1.0f32 } else { 0.0 }];
    if let Err(e) = world.all_reduce_in_place(&mut flag, ReduceOp::Max) {
        eprintln!("rank {rank}: cannot agree on the outcome of {name}: {e}");
        return None;
    }
    let ok = flag[0] == 0.0;
    if rank == 0 {
        let verdict = if ok { "ok" } else { "FAILED" };
        println!(
            "test {name} ... {verdict} ({} ms)",
            start.elapsed().as_millis()
        );
    }
    Some(ok)
}

/// `--rank-dies`: the last rank exits without finalising while the others enter an
/// all-reduce; they must report an error naming it (run with `mpirun --enable-recovery`, or
/// OpenMPI kills the whole job, which is also not a hang).
fn rank_dies(mpi: &Mpi) -> ExitCode {
    let Ok(c) = mpi.world(Config::with_timeout(Duration::from_secs(5))) else {
        return ExitCode::FAILURE;
    };
    let (n, r) = (c.size(), c.rank());
    if c.barrier().is_err() || n == 1 {
        return ExitCode::FAILURE;
    }
    if r == n - 1 {
        std::process::exit(3);
    }
    let start = Instant::now();
    let mut x = vec![1f32; 1000];
    match c.all_reduce_in_place(&mut x, ReduceOp::Sum) {
        Err(e) if e.to_string().contains("all_reduce #1") => {
            println!("rank {r}: after {:.1?}: {e}", start.elapsed());
            ExitCode::SUCCESS
        }
        other => {
            println!("rank {r}: want an error naming all_reduce #1, got {other:?}");
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let selected = |name: &str| filters.is_empty() || filters.iter().any(|f| name.contains(f));
    let mpi = match Mpi::init() {
        Ok(m) => m,
        Err(e) => {
            eprintln!("mpi_conformance: {e}");
            return ExitCode::FAILURE;
        }
    };
    if std::env::args().any(|a| a == "--rank-dies") {
        return rank_dies(&mpi);
    }
    let world = match mpi.world(Config::with_timeout(CASE_TIMEOUT)) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("mpi_conformance: {e}");
            return ExitCode::FAILURE;
        }
    };
    let (rank, size) = (world.rank(), world.size());
    if rank == 0 {
        println!("running the conformance suite on {size} MPI ranks");
    }
    let (mut passed, mut failed) = (0, 0);
    let mut tally = |name: &str, run: &dyn Fn() -> Result| -> bool {
        if !selected(name) {
            return true;
        }
        match run_one(&world, name, run) {
            Some(true) => passed += 1,
            Some(false) => failed += 1,
            None => return false,
        }
        true
    };
    for &(name, case) in conformance::CASES {
        if !tally(name, &|| case(&world)) {
            return ExitCode::FAILURE;
        }
    }
    for &(name, case) in MPI_CASES {
        if !tally(name, &|| case(&mpi)) {
            return ExitCode::FAILURE;
        }
    }
    if rank == 0 {
        println!("{passed} passed, {failed} failed ({size} ranks)");
    }
    drop(world);
    drop(mpi);
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
