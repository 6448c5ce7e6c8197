//! The engine of `zero-bench`: runs one collective over a range of sizes on the local
//! backend, times out-of-place and in-place forms, checks results, and reports nccl-tests'
//! columns plus the memory bandwidth the local algorithm achieved.

use std::time::Instant;

use half::{bf16, f16};
use zero_comm::{
    local, with_element, Collective, CommError, Communicator, DType, Element, OpKind, ReduceOp,
};

/// What to run; the fields mirror nccl-tests' flags.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// The collective.
    pub op: OpKind,
    /// `-b`: smallest size in bytes.
    pub min_bytes: u64,
    /// `-e`: largest size in bytes.
    pub max_bytes: u64,
    /// `-f`: multiplication factor between sizes.
    pub factor: u64,
    /// `-n`: timed iterations per size.
    pub iters: usize,
    /// `-w`: warm-up iterations per size.
    pub warmup: usize,
    /// `-c`: check results.
    pub check: bool,
    /// `-d`: element type.
    pub dtype: DType,
    /// `-o`: reduction.
    pub redop: ReduceOp,
    /// `-r`: root of broadcast and reduce.
    pub root: usize,
    /// `--ranks`: local ranks (threads).
    pub ranks: usize,
}

/// One placement's result at one size.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Measurement {
    /// Average time per iteration (slowest rank), microseconds.
    pub time_us: f64,
    /// size / time, GB/s (decimal).
    pub algbw: f64,
    /// algbw x the op's bus factor.
    pub busbw: f64,
    /// Bytes the algorithm read and wrote in memory (all ranks) / time, GB/s.
    pub membw: f64,
    /// Elements differing from the expected result over all ranks; `None` without `-c 1`.
    pub wrong: Option<u64>,
}

/// One line of the table.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Row {
    /// Bytes of the whole array (nccl-tests' `size`).
    pub size: u64,
    /// Elements of the whole array.
    pub count: usize,
    /// Out-of-place result.
    pub out_of_place: Measurement,
    /// In-place result.
    pub in_place: Measurement,
}

/// nccl-tests' bus bandwidth factor for `op` on `n` ranks.
pub fn bus_factor(op: OpKind, n: usize) -> f64 {
    let n = n as f64;
    match op {
        OpKind::AllReduce => 2.0 * (n - 1.0) / n,
        OpKind::ReduceScatter | OpKind::AllGather => (n - 1.0) / n,
        _ => 1.0,
    }
}

/// The sizes from `min` to `max` multiplying by `factor` (at least one size).
pub fn sizes(min: u64, max: u64, factor: u64) -> Vec<u64> {
    let mut out = vec![min];
    let mut s = min;
    while factor > 1 && s > 0 && s.saturating_mul(factor) <= max {
        s *= factor;
        out.push(s);
    }
    out
}

impl BenchConfig {
    /// The call this configuration makes.
    pub fn call(&self) -> Option<Collective> {
        Some(match self.op {
            OpKind::AllReduce => Collective::AllReduce(self.redop),
            OpKind::ReduceScatter => Collective::ReduceScatter(self.redop),
            OpKind::AllGather => Collective::AllGather,
            OpKind::Broadcast => Collective::Broadcast(self.root),
            OpKind::Reduce => Collective::Reduce(self.redop, self.root),
            OpKind::Barrier | OpKind::Split => return None,
        })
    }

    /// Elements of the whole array for `bytes` (a multiple of the ranks where the op needs it).
    pub fn count(&self, bytes: u64) -> usize {
        let c = (bytes / self.dtype.size() as u64) as usize;
        match self.op {
            OpKind::ReduceScatter | OpKind::AllGather => c / self.ranks * self.ranks,
            _ => c,
        }
    }
}

/// Input element `i` of `rank`: small integers, exact in every dtype and in f32 sums.
fn input(rank: usize, i: usize) -> f64 {
    ((rank * 7 + i * 3) % 11) as f64 - 5.0
}

/// A dtype's conversions from and to the f64 reference (inputs and sums are small integers,
/// exact in every type).
pub(crate) trait Round: Element {
    fn round(v: f64) -> Self;
    fn to_f64(self) -> f64;
    /// Relative precision, for avg's tolerance (integers have no avg).
    const EPS: f64;
}

macro_rules! round {
    ($t:ty, $eps:expr, $round:expr, $back:expr) => {
        impl Round for $t {
            fn round(v: f64) -> Self {
                $round(v)
            }
            fn to_f64(self) -> f64 {
                $back(self)
            }
            const EPS: f64 = $eps;
        }
    };
}
round!(f32, 1.0 / 8_388_608.0, |v| v as f32, f64::from);
round!(bf16, 1.0 / 128.0, bf16::from_f64, bf16::to_f64);
round!(f16, 1.0 / 1024.0, f16::from_f64, f16::to_f64);
round!(i32, 0.0, |v| v as i32, f64::from);
round!(i64, 0.0, |v| v as i64, |x| x as f64);
round!(f64, f64::EPSILON, |v| v, |x| x);

/// Reference value of element `i` of the reduction (f64, then rounded by the caller).
fn reduced(i: usize, n: usize, op: ReduceOp) -> f64 {
    let vals = (0..n).map(|k| input(k, i));
    match op {
        ReduceOp::Sum => vals.sum(),
        ReduceOp::Avg => vals.sum::<f64>() / n as f64,
        ReduceOp::Max => vals.fold(f64::NEG_INFINITY, f64::max),
        ReduceOp::Min => vals.fold(f64::INFINITY, f64::min),
    }
}

/// Runs the benchmark; `report` is called on rank 0 as each row completes.
///
/// # Errors
/// Any collective error, or an unsupported op.
pub fn run(cfg: &BenchConfig, report: &mut (dyn FnMut(&Row) + Send)) -> Result<(), CommError> {
    with_element!(cfg.dtype, T => run_typed::<T>(cfg, report))
}

fn run_typed<T: Round>(
    cfg: &BenchConfig,
    report: &mut (dyn FnMut(&Row) + Send),
) -> Result<(), CommError> {
    let call = cfg.call().ok_or_else(|| CommError::InvalidArgument {
        what: format!("{} has no data to benchmark", cfg.op),
    })?;
    if cfg.root >= cfg.ranks {
        return Err(CommError::Root {
            op: cfg.op,
            root: cfg.root,
            size: cfg.ranks,
        });
    }
    let comms = local::create(cfg.ranks)?;
    let report = std::sync::Mutex::new(report);
    std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .into_iter()
            .map(|comm| {
                let report = &report;
                s.spawn(move || rank_main::<T>(cfg, call, &comm, report))
            })
            .collect();
        hs.into_iter().try_for_each(|h| {
            h.join().unwrap_or_else(|_| {
                Err(CommError::InvalidArgument {
                    what: "a rank panicked".into(),
                })
            })
        })
    })
}

/// Runs the benchmark on `comm`, this process's rank of a group whose other ranks are other
/// processes (the MPI backend under `mpirun`); `report` is called on rank 0. `cfg.ranks` must
/// be `comm.size()`.
///
/// # Errors
/// As [`run`].
pub fn run_on(
    cfg: &BenchConfig,
    comm: &Communicator,
    report: &mut (dyn FnMut(&Row) + Send),
) -> Result<(), CommError> {
    let call = cfg.call().ok_or_else(|| CommError::InvalidArgument {
        what: format!("{} has no data to benchmark", cfg.op),
    })?;
    if cfg.root >= comm.size() {
        return Err(CommError::Root {
            op: cfg.op,
            root: cfg.root,
            size: comm.size(),
        });
    }
    let report = std::sync::Mutex::new(report);
    with_element!(cfg.dtype, T => rank_main::<T>(cfg, call, comm, &report))
}

/// Buffer lengths (send, recv) for the out-of-place call on `count` elements.
pub(crate) fn lengths(op: OpKind, count: usize, n: usize) -> (usize, usize) {
    match op {
        OpKind::ReduceScatter => (count, count / n),
        OpKind::AllGather => (count / n, count),
        _ => (count, count),
    }
}

fn rank_main<T: Round>(
    cfg: &BenchConfig,
    call: Collective,
    comm: &Communicator,
    report: &std::sync::Mutex<&mut (dyn FnMut(&Row) + Send)>,
) -> Result<(), CommError> {
    let max_count = cfg.count(cfg.max_bytes.max(cfg.min_bytes));
    let mut send = buffer::<T>(max_count)?;
    let mut recv = buffer::<T>(max_count)?;
    for bytes in sizes(cfg.min_bytes, cfg.max_bytes, cfg.factor) {
        let count = cfg.count(bytes);
        let mut m = [[0.0f32; 2]; 2]; // [placement][time, wrong]
        for (p, in_place) in [false, true].into_iter().enumerate() {
            let (sl, rl) = lengths(cfg.op, count, cfg.ranks);
            let once = |send: &[T], recv: &mut [T]| {
                if in_place {
                    comm.collective::<T>(call, None, &mut recv[..count])
                } else {
                    comm.collective(call, Some(&send[..sl]), &mut recv[..rl])
                }
            };
            for _ in 0..cfg.warmup {
                once(&send, &mut recv)?;
            }
            comm.barrier()?;
            let t = Instant::now();
            for _ in 0..cfg.iters {
                once(&send, &mut recv)?;
            }
            m[p][0] = t.elapsed().as_secs_f32() / cfg.iters.max(1) as f32;
            if cfg.check {
                fill::<T>(
                    cfg.op,
                    comm.rank(),
                    cfg.ranks,
                    count,
                    in_place,
                    &mut send,
                    &mut recv,
                );
                once(&send, &mut recv)?;
                m[p][1] = wrong::<T>(cfg, comm.rank(), count, in_place, &recv) as f32;
            }
        }
        let mut times = [m[0][0], m[1][0]];
        comm.all_reduce_in_place(&mut times, ReduceOp::Max)?;
        let mut wrongs = [m[0][1], m[1][1]];
        comm.all_reduce_in_place(&mut wrongs, ReduceOp::Sum)?;
        if comm.rank() == 0 {
            let size = (count * T::DTYPE.size()) as u64;
            // The local algorithm's memory traffic; other backends move bytes elsewhere.
            let traffic = |in_place| {
                if comm.backend() == "local" {
                    local::memory_traffic(cfg.op, size, cfg.ranks, in_place) as f64
                } else {
                    f64::NAN
                }
            };
            let row = row(cfg, (count, T::DTYPE.size()), times, wrongs, traffic);
            let mut r = report
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            (*r)(&row);
        }
    }
    Ok(())
}

/// One size's row from the slowest rank's mean times and the summed wrong counts, out of
/// place then in place; `(count, elem)` are the elements and their bytes, and
/// `traffic(in_place)` the bytes the algorithm moves through memory (NaN where not ours to
/// count).
pub(crate) fn row(
    cfg: &BenchConfig,
    (count, elem): (usize, usize),
    times: [f32; 2],
    wrongs: [f32; 2],
    traffic: impl Fn(bool) -> f64,
) -> Row {
    let size = (count * elem) as u64;
    let meas = |p: usize| {
        let secs = f64::from(times[p]).max(1e-12);
        let algbw = size as f64 / secs / 1e9;
        Measurement {
            time_us: secs * 1e6,
            algbw,
            busbw: algbw * bus_factor(cfg.op, cfg.ranks),
            membw: traffic(p == 1) / secs / 1e9,
            wrong: cfg.check.then_some(wrongs[p] as u64),
        }
    };
    Row {
        size,
        count,
        out_of_place: meas(0),
        in_place: meas(1),
    }
}

/// A zeroed buffer, or an error (not an abort) when `-e` asks for more memory than there is.
pub(crate) fn buffer<T: Element>(count: usize) -> Result<Vec<T>, CommError> {
    let mut v = Vec::new();
    v.try_reserve_exact(count)
        .map_err(|e| CommError::InvalidArgument {
            what: format!("cannot allocate {count} elements for -e: {e}"),
        })?;
    v.resize(count, T::default());
    Ok(v)
}

/// Fills this rank's input for a checked run.
pub(crate) fn fill<T: Round>(
    op: OpKind,
    rank: usize,
    n: usize,
    count: usize,
    in_place: bool,
    send: &mut [T],
    recv: &mut [T],
) {
    let per = count / n.max(1);
    let (sl, _) = lengths(op, count, n);
    let buf: &mut [T] = if in_place {
        &mut recv[..count]
    } else {
        &mut send[..sl]
    };
    buf.iter_mut().for_each(|x| *x = T::default());
    match (op, in_place) {
        (OpKind::AllGather, true) => {
            for i in 0..per {
                buf[rank * per + i] = T::round(input(rank, i));
            }
        }
        _ => {
            for (i, x) in buf.iter_mut().enumerate() {
                *x = T::round(input(rank, i));
            }
        }
    }
}

/// Counts the elements of this rank's result that differ from the reference.
pub(crate) fn wrong<T: Round>(
    cfg: &BenchConfig,
    rank: usize,
    count: usize,
    in_place: bool,
    recv: &[T],
) -> u64 {
    let n = cfg.ranks;
    let per = count / n;
    let op = cfg.redop;
    let tol = |want: T| {
        if op == ReduceOp::Avg {
            want.to_f64().abs() * T::EPS * 1.01
        } else {
            0.0
        }
    };
    // A NaN result counts as wrong.
    let bad = |got: T, want: T| {
        let diff = (got.to_f64() - want.to_f64()).abs();
        diff.is_nan() || diff > tol(want)
    };
    let bad_count =
        |range: std::ops::Range<usize>, at: &dyn Fn(usize) -> usize, want: &dyn Fn(usize) -> T| {
            range.filter(|&i| bad(recv[at(i)], want(i))).count() as u64
        };
    match cfg.op {
        OpKind::AllReduce => bad_count(0..count, &|i| i, &|i| T::round(reduced(i, n, op))),
        OpKind::ReduceScatter => {
            let base = if in_place { rank * per } else { 0 };
            bad_count(0..per, &|j| base + j, &|j| {
                T::round(reduced(rank * per + j, n, op))
            })
        }
        OpKind::AllGather => bad_count(0..count, &|i| i, &|i| T::round(input(i / per, i % per))),
        OpKind::Broadcast => bad_count(0..count, &|i| i, &|i| T::round(input(cfg.root, i))),
        OpKind::Reduce if rank == cfg.root => {
            bad_count(0..count, &|i| i, &|i| T::round(reduced(i, n, op)))
        }
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op_reduces(op: OpKind) -> bool {
        matches!(
            op,
            OpKind::AllReduce | OpKind::ReduceScatter | OpKind::Reduce
        )
    }

    fn cfg(op: OpKind, dtype: DType, redop: ReduceOp) -> BenchConfig {
        BenchConfig {
            op,
            min_bytes: 24,
            max_bytes: 6 << 10,
            factor: 4,
            iters: 2,
            warmup: 1,
            check: true,
            dtype,
            redop,
            root: 1,
            ranks: 3,
        }
    }

    #[test]
    fn every_op_and_dtype_checks_clean() {
        let ops = [
            OpKind::AllReduce,
            OpKind::ReduceScatter,
            OpKind::AllGather,
            OpKind::Broadcast,
            OpKind::Reduce,
        ];
        for op in ops {
            for dtype in DType::ALL {
                for redop in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min] {
                    let mut rows = Vec::new();
                    if op_reduces(op) && !redop.supports(dtype) {
                        let e = run(&cfg(op, dtype, redop), &mut |r: &Row| rows.push(*r));
                        let refused = matches!(e, Err(CommError::UnsupportedReduction { .. }));
                        assert!(refused && rows.is_empty(), "{op} {dtype} {redop}: {e:?}");
                        continue;
                    }
                    run(&cfg(op, dtype, redop), &mut |r: &Row| rows.push(*r)).unwrap();
                    assert_eq!(rows.len(), 5, "{op} {dtype}"); // 24 B .. 6 KiB by 4
                    for r in rows {
                        assert_eq!(r.out_of_place.wrong, Some(0), "{op} {dtype} {redop} {r:?}");
                        assert_eq!(r.in_place.wrong, Some(0), "{op} {dtype} {redop} {r:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn wrong_counts_corrupted_elements() {
        let c = cfg(OpKind::AllReduce, DType::F32, ReduceOp::Sum);
        let count = 30;
        let mut good: Vec<f32> = (0..count)
            .map(|i| reduced(i, 3, ReduceOp::Sum) as f32)
            .collect();
        assert_eq!(wrong::<f32>(&c, 0, count, false, &good), 0);
        good[7] += 1.0;
        good[20] = f32::NAN;
        assert_eq!(wrong::<f32>(&c, 0, count, false, &good), 2);
    }

    #[test]
    fn bus_factors_and_sizes_follow_nccl_tests() {
        assert_eq!(bus_factor(OpKind::AllReduce, 4), 1.5);
        assert_eq!(bus_factor(OpKind::AllGather, 4), 0.75);
        assert_eq!(bus_factor(OpKind::Broadcast, 4), 1.0);
        assert_eq!(sizes(8, 100, 2), vec![8, 16, 32, 64]);
        assert_eq!(sizes(8, 8, 2), vec![8]);
        assert_eq!(sizes(0, 64, 2), vec![0]);
    }
}
