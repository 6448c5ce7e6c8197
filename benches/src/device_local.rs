//! `zero-bench --backend local --device cuda` (feature `cuda`): `--ranks` threads sharing GPU
//! 0 over zero-comm's device-local backend, with the sizes, checks and table of the other
//! backends. Timing: `iters` calls back to back on each rank's stream, then one wait; the time
//! per iteration is the slowest rank's. Not yet run on a GPU.

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{CudaSlice, CudaStream, DeviceRepr, ValidAsZeroBits};
use zero_comm::device_local::cuda::{create, CudaOps};
use zero_comm::device_local::{DeviceLocalComm, DeviceOps};
use zero_comm::{Collective, CommError, Communicator, ReduceOp};

use crate::collective::{fill, lengths, row, sizes, wrong, BenchConfig, Round, Row};

fn cuda(call: &'static str) -> impl Fn(cudarc::driver::DriverError) -> CommError {
    move |e| CommError::Vendor {
        backend: "cuda",
        call,
        name: format!("{:?}", e.0),
        code: i64::from(e.0 as u32),
    }
}

/// Runs the benchmark over `cfg.ranks` threads on GPU 0; `report` gets rank 0's rows.
///
/// # Errors
/// No CUDA driver (named, never a panic), collective or CUDA errors.
pub fn run_device_local(cfg: &BenchConfig, report: &mut dyn FnMut(&Row)) -> Result<(), CommError> {
    let call = cfg.call().ok_or_else(|| CommError::InvalidArgument {
        what: format!("{} has no data to benchmark", cfg.op),
    })?;
    zero_alloc::CudaLibrary::Driver
        .require()
        .map_err(|e| CommError::InvalidArgument {
            what: format!("--device cuda: {e}"),
        })?;
    let ctx =
        zero_alloc::context::untracked_context(0).map_err(|e| CommError::InvalidArgument {
            what: format!("--device cuda: {e}"),
        })?;
    let devices = create(&ctx, cfg.ranks, zero_comm::Config::default())?;
    let hosts = zero_comm::local::create(cfg.ranks)?;
    let rows = std::thread::scope(|s| {
        let handles: Vec<_> = devices
            .into_iter()
            .zip(hosts)
            .map(|(dev, host)| s.spawn(move || rank_rows(cfg, call, dev, &host)))
            .collect();
        let mut first = None;
        for h in handles {
            let rows = h.join().unwrap_or_else(|_| {
                Err(CommError::InvalidArgument {
                    what: "a rank thread panicked".into(),
                })
            });
            first.get_or_insert(rows);
        }
        first.unwrap_or(Ok(Vec::new()))
    })?;
    rows.iter().for_each(report);
    Ok(())
}

fn rank_rows(
    cfg: &BenchConfig,
    call: Collective,
    dev: DeviceLocalComm<CudaOps>,
    host: &Communicator,
) -> Result<Vec<Row>, CommError> {
    // Reductions of i32, i64 and f64 are refused by the backend (its kernel reduces the f32
    // family); their all-gather and broadcast run.
    zero_comm::with_element!(cfg.dtype, T => rank_main::<T>(cfg, call, dev, host))
}

/// One call of `call` on the first elements of the device buffers.
fn launch<T: Round>(
    dev: &mut DeviceLocalComm<CudaOps>,
    call: Collective,
    in_place: bool,
    (send, recv): (&CudaSlice<T>, &mut CudaSlice<T>),
    (sl, rl): (usize, usize),
) -> Result<(), CommError> {
    let s = send.slice(..sl);
    let mut r = recv.slice_mut(..rl);
    dev.run::<T, _, _>(call, (!in_place).then_some(&s), &mut r)
}

/// Sets the device buffers for a checked call, runs it and counts the wrong elements.
fn checked<T: Round + DeviceRepr>(
    cfg: &BenchConfig,
    call: Collective,
    dev: &mut DeviceLocalComm<CudaOps>,
    stream: &Arc<CudaStream>,
    bufs: (&mut CudaSlice<T>, &mut CudaSlice<T>),
    (count, in_place, lens): (usize, bool, (usize, usize)),
) -> Result<f32, CommError> {
    let (rank, n) = (dev.rank(), cfg.ranks);
    // Only the first `count` elements are filled, used and checked.
    let (mut hs, mut hr) = (vec![T::default(); count], vec![T::default(); count]);
    fill::<T>(cfg.op, rank, n, count, in_place, &mut hs, &mut hr);
    stream
        .memcpy_htod(&hs, &mut bufs.0.slice_mut(..count))
        .map_err(cuda("cuMemcpyHtoD"))?;
    stream
        .memcpy_htod(&hr, &mut bufs.1.slice_mut(..count))
        .map_err(cuda("cuMemcpyHtoD"))?;
    launch(dev, call, in_place, (&*bufs.0, &mut *bufs.1), lens)?;
    stream
        .memcpy_dtoh(&bufs.1.slice(..count), &mut hr)
        .map_err(cuda("cuMemcpyDtoH"))?;
    stream.synchronize().map_err(cuda("cuStreamSynchronize"))?;
    Ok(wrong::<T>(cfg, rank, count, in_place, &hr) as f32)
}

fn rank_main<T: Round + DeviceRepr + ValidAsZeroBits>(
    cfg: &BenchConfig,
    call: Collective,
    mut dev: DeviceLocalComm<CudaOps>,
    host: &Communicator,
) -> Result<Vec<Row>, CommError> {
    let stream = Arc::clone(dev.ops().stream());
    let len = cfg.count(cfg.max_bytes.max(cfg.min_bytes)).max(1);
    let alloc = || stream.alloc_zeros::<T>(len).map_err(cuda("cuMemAlloc"));
    let (mut send, mut recv) = (alloc()?, alloc()?);
    let mut rows = Vec::new();
    for bytes in sizes(cfg.min_bytes, cfg.max_bytes, cfg.factor) {
        let count = cfg.count(bytes);
        let (sl, rl) = lengths(cfg.op, count, cfg.ranks);
        let mut m = [[0f32; 2]; 2]; // [placement][time, wrong]
        for (p, in_place) in [false, true].into_iter().enumerate() {
            let lens = if in_place { (0, count) } else { (sl, rl) };
            for _ in 0..cfg.warmup {
                launch(&mut dev, call, in_place, (&send, &mut recv), lens)?;
            }
            dev.barrier()?;
            let t = Instant::now();
            for _ in 0..cfg.iters {
                launch(&mut dev, call, in_place, (&send, &mut recv), lens)?;
            }
            dev.ops().synchronize()?;
            m[p][0] = t.elapsed().as_secs_f32() / cfg.iters.max(1) as f32;
            if cfg.check {
                let bufs = (&mut send, &mut recv);
                m[p][1] = checked(cfg, call, &mut dev, &stream, bufs, (count, in_place, lens))?;
            }
        }
        let mut times = [m[0][0], m[1][0]];
        host.all_reduce_in_place(&mut times, ReduceOp::Max)?;
        let mut wrongs = [m[0][1], m[1][1]];
        host.all_reduce_in_place(&mut wrongs, ReduceOp::Sum)?;
        if dev.rank() == 0 {
            let elems = (count, T::DTYPE.size());
            rows.push(row(cfg, elems, times, wrongs, |_| f64::NAN));
        }
    }
    Ok(rows)
}
