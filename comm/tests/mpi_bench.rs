//! Measurements behind docs/mpi.md, one process per rank:
//!
//! ```sh
//! cargo test --release -p zero-comm --features mpi --test mpi_bench --no-run
//! mpirun --oversubscribe -np 2 target/release/deps/mpi_bench-* full
//! ```
//!
//! 1. f32 all-reduce, `Algorithm::Deterministic` (alltoall + rank-order reduction + all-gather)
//!    against `Algorithm::Native` (`MPI_Iallreduce`), nccl-tests columns.
//! 2. Overlap of one all-reduce with compute: the communicator's progress thread against
//!    MPI's own nonblocking collective (waited at the end, or tested between compute slices).
//!
//! Without `full` (as `cargo test` runs it) it does one tiny round of each and only checks
//! results, so the suite stays fast; timings are printed, never asserted.

use std::os::raw::c_int;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use mpi::ffi;
use zero_comm::mpi::{Algorithm, Mpi};
use zero_comm::{Communicator, Config, ReduceOp};

fn time_all_reduce(c: &Communicator, buf: &mut [f32], iters: usize) -> zero_comm::Result<f64> {
    for _ in 0..3 {
        c.all_reduce_in_place(buf, ReduceOp::Sum)?;
    }
    c.barrier()?;
    let start = Instant::now();
    for _ in 0..iters {
        c.all_reduce_in_place(buf, ReduceOp::Sum)?;
    }
    let mine = [start.elapsed().as_secs_f64() / iters as f64];
    // The slowest rank's time, as a collective finishes when its last rank does.
    let mut worst = vec![0f32; 1];
    c.all_reduce(&[mine[0] as f32], &mut worst, ReduceOp::Max)?;
    Ok(f64::from(worst[0]))
}

/// The table of part 1.
fn algorithms(mpi: &Mpi, full: bool) -> zero_comm::Result<()> {
    let config = Config::with_timeout(Duration::from_secs(120));
    let det = mpi.world_with(config, Algorithm::Deterministic)?;
    let nat = mpi.world_with(config, Algorithm::Native)?;
    let n = det.size();
    let sizes: Vec<usize> = if full {
        (0..6).map(|k| 4096 << (2 * k)).collect() // 4 KiB .. 4 MiB
    } else {
        vec![4096]
    };
    let factor = 2.0 * (n as f64 - 1.0) / n as f64;
    if det.rank() == 0 {
        println!("# all_reduce f32 sum, {n} ranks; time = slowest rank, busbw = algbw * 2(n-1)/n");
        println!("#     size    count | deterministic: time(us) busbw(GB/s) | native: time(us) busbw(GB/s)");
    }
    for bytes in sizes {
        let count = bytes / 4;
        let iters = if full {
            (64 << 20) / bytes.max(1 << 16) + 5
        } else {
            2
        };
        let mut a: Vec<f32> = (0..count).map(|i| (i % 7) as f32).collect();
        let mut b = a.clone();
        let td = time_all_reduce(&det, &mut a, iters)?;
        let tn = time_all_reduce(&nat, &mut b, iters)?;
        let bw = |t: f64| bytes as f64 / t / 1e9 * factor;
        if det.rank() == 0 {
            println!(
                "{bytes:>10} {count:>8} | {:>12.1} {:>11.3} | {:>12.1} {:>11.3}",
                td * 1e6,
                bw(td),
                tn * 1e6,
                bw(tn)
            );
        }
    }
    Ok(())
}

/// Compute that does not touch the communicated buffer: `reps` passes of a multiply-add.
fn compute(work: &mut [f32], reps: usize) {
    for _ in 0..reps {
        for x in work.iter_mut() {
            *x = *x * 0.999_9 + 0.000_1;
        }
    }
    std::hint::black_box(work);
}

/// MPI's own nonblocking all-reduce (`MPI_Iallreduce` on the world) of `send` into `recv`,
/// overlapped with `reps` slices of compute, calling `MPI_Test` between slices or not.
fn raw_overlap(send: &[f32], recv: &mut [f32], work: &mut [f32], reps: usize, test: bool) -> f64 {
    let start = Instant::now();
    // SAFETY: reading a predefined constant handle.
    let mut req = unsafe { ffi::RSMPI_REQUEST_NULL };
    let count = c_int::try_from(send.len()).unwrap_or(c_int::MAX);
    // SAFETY: both buffers live and are untouched until the request completes below; the
    // world communicator and constants are predefined; MPI was initialised by `Mpi::init`.
    unsafe {
        ffi::MPI_Iallreduce(
            send.as_ptr().cast(),
            recv.as_mut_ptr().cast(),
            count,
            ffi::RSMPI_FLOAT,
            ffi::RSMPI_SUM,
            ffi::RSMPI_COMM_WORLD,
            &mut req,
        );
    }
    for _ in 0..reps {
        compute(work, 1);
        if test {
            let mut done: c_int = 0;
            // SAFETY: `req` is the request started above (or already completed and null).
            unsafe { ffi::MPI_Test(&mut req, &mut done, ffi::RSMPI_STATUS_IGNORE) };
        }
    }
    // SAFETY: as above; a null request (completed by MPI_Test) returns at once.
    unsafe { ffi::MPI_Wait(&mut req, ffi::RSMPI_STATUS_IGNORE) };
    start.elapsed().as_secs_f64()
}

/// The slowest rank's value.
fn slowest(c: &Communicator, v: f64) -> zero_comm::Result<f64> {
    let mut out = [0f32];
    c.all_reduce(&[v as f32], &mut out, ReduceOp::Max)?;
    Ok(f64::from(out[0]))
}

/// The median over `runs` of the slowest rank's value of `f`, each run after a barrier.
fn median(
    c: &Communicator,
    runs: usize,
    mut f: impl FnMut() -> zero_comm::Result<f64>,
) -> zero_comm::Result<f64> {
    let mut v = Vec::with_capacity(runs);
    for _ in 0..runs {
        c.barrier()?;
        let t = f()?;
        v.push(slowest(c, t)?);
    }
    v.sort_by(f64::total_cmp);
    Ok(v[v.len() / 2])
}

/// Part 2: how much of one all-reduce hides behind compute.
fn overlap(mpi: &Mpi, full: bool) -> zero_comm::Result<()> {
    let c = mpi.world(Config::with_timeout(Duration::from_secs(120)))?;
    let count = if full { 4 << 20 } else { 1024 };
    let send: Vec<f32> = (0..count).map(|i| (i % 5) as f32).collect();
    let mut recv = vec![0f32; count];
    let mut work = vec![1f32; 64 << 10];
    let runs = if full { 5 } else { 1 };
    // Baselines: communication alone (each way), one compute slice alone.
    let mut buf = send.clone();
    let t_comm = median(&c, runs, || {
        let t = Instant::now();
        c.all_reduce_in_place(&mut buf, ReduceOp::Sum)?;
        Ok(t.elapsed().as_secs_f64())
    })?;
    let t_raw = median(&c, runs, || {
        Ok(raw_overlap(&send, &mut recv, &mut work, 0, false))
    })?;
    let slice = median(&c, runs, || {
        let t = Instant::now();
        compute(&mut work, 16);
        Ok(t.elapsed().as_secs_f64() / 16.0)
    })?;
    // Compute as long as the slower communication, identical on every rank.
    let reps = ((t_comm.max(t_raw) / slice).ceil() as usize).max(1);
    let t_comp = median(&c, runs, || {
        let t = Instant::now();
        compute(&mut work, reps);
        Ok(t.elapsed().as_secs_f64())
    })?;
    let mut out = Vec::new();
    let t_thread = median(&c, runs, || {
        let t = Instant::now();
        let w = c.all_reduce_async(send.clone(), ReduceOp::Sum);
        compute(&mut work, reps);
        out = w.wait()?;
        Ok(t.elapsed().as_secs_f64())
    })?;
    let t_wait = median(&c, runs, || {
        Ok(raw_overlap(&send, &mut recv, &mut work, reps, false))
    })?;
    let t_test = median(&c, runs, || {
        Ok(raw_overlap(&send, &mut recv, &mut work, reps, true))
    })?;
    let n = c.size() as f32;
    if out[1] != n || recv[1] != n {
        return Err(zero_comm::CommError::InvalidArgument {
            what: format!("overlap: wrong sums {} / {}", out[1], recv[1]),
        });
    }
    if c.rank() == 0 {
        let times = OverlapTimes {
            comm: t_comm,
            raw: t_raw,
            comp: t_comp,
            thread: t_thread,
            wait: t_wait,
            test: t_test,
        };
        print_overlap(&times, count, c.size());
    }
    Ok(())
}

/// Seconds measured by [`overlap`]: each communication alone, the compute alone, and each
/// variant of communication behind compute.
struct OverlapTimes {
    comm: f64,
    raw: f64,
    comp: f64,
    thread: f64,
    wait: f64,
    test: f64,
}

/// The overlap table: how much of each communication the compute hid.
fn print_overlap(t: &OverlapTimes, count: usize, ranks: usize) {
    let hidden = |comm: f64, total: f64| (comm + t.comp - total) / comm.min(t.comp) * 100.0;
    println!(
        "# overlap of one {} MiB f32 all_reduce with {:.1} ms of compute, {ranks} ranks",
        (count * 4) >> 20,
        t.comp * 1e3,
    );
    println!("# variant                              comm alone(ms)  comm+compute(ms)  hidden(%)");
    let rows = [
        ("progress thread (Communicator async) ", t.comm, t.thread),
        ("MPI_Iallreduce, MPI_Wait at the end  ", t.raw, t.wait),
        ("MPI_Iallreduce, MPI_Test per slice   ", t.raw, t.test),
    ];
    for (name, alone, both) in rows {
        println!(
            "{name}  {:>13.2} {:>17.2} {:>10.0}",
            alone * 1e3,
            both * 1e3,
            hidden(alone, both)
        );
    }
}

fn main() -> ExitCode {
    let full = std::env::args().any(|a| a == "full");
    let Ok(mpi) = Mpi::init() else {
        eprintln!("mpi_bench: cannot initialise MPI");
        return ExitCode::FAILURE;
    };
    if let Err(e) = algorithms(&mpi, full).and_then(|()| overlap(&mpi, full)) {
        eprintln!("mpi_bench: {e}");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
