//! `zero-bench --backend nccl` (feature `cuda`): the same sizes, checks and table as the
//! host backends, over device buffers on this process's GPU. One rank per process.
//!
//! Timing follows nccl-tests: `iters` launches back to back on the communicator's stream,
//! then one wait; the time per iteration is the slowest rank's.

use std::time::Instant;

use cudarc::driver::{CudaSlice, DeviceRepr, ValidAsZeroBits};
use zero_comm::nccl::{NcclComm, NcclWork};
use zero_comm::{Collective, CommError, ReduceOp};

use crate::collective::{fill, lengths, row, sizes, wrong, BenchConfig, Round, Row};

fn cuda(call: &'static str) -> impl Fn(cudarc::driver::DriverError) -> CommError {
    move |e| CommError::Vendor {
        backend: "cuda",
        call,
        name: format!("{:?}", e.0),
        code: i64::from(e.0 as u32),
    }
}

/// Runs the benchmark on `comm`; `report` is called on rank 0. `cfg.ranks` must be
/// `comm.size()`.
///
/// # Errors
/// Any collective or CUDA error.
pub fn run_nccl(
    cfg: &BenchConfig,
    comm: &NcclComm,
    report: &mut dyn FnMut(&Row),
) -> Result<(), CommError> {
    let call = cfg.call().ok_or_else(|| CommError::InvalidArgument {
        what: format!("{} has no data to benchmark", cfg.op),
    })?;
    zero_comm::with_element!(cfg.dtype, T => rank_main::<T>(cfg, call, comm, report))
}

/// One launch of `call` on the first elements of the device buffers.
fn launch<T: Round>(
    comm: &NcclComm,
    call: Collective,
    in_place: bool,
    (send, recv): (&CudaSlice<T>, &mut CudaSlice<T>),
    (sl, rl): (usize, usize),
) -> Result<NcclWork, CommError> {
    let s = send.slice(..sl);
    let mut r = recv.slice_mut(..rl);
    let mut g = comm.group();
    match (call, in_place) {
        (Collective::AllReduce(op), false) => g.all_reduce(&s, &mut r, op)?,
        (Collective::AllReduce(op), true) => g.all_reduce_in_place(&mut r, op)?,
        (Collective::ReduceScatter(op), false) => g.reduce_scatter(&s, &mut r, op)?,
        (Collective::ReduceScatter(op), true) => g.reduce_scatter_in_place(&mut r, op)?,
        (Collective::AllGather, false) => g.all_gather(&s, &mut r)?,
        (Collective::AllGather, true) => g.all_gather_in_place(&mut r)?,
        (Collective::Broadcast(root), false) => g.broadcast(Some(&s), &mut r, root)?,
        (Collective::Broadcast(root), true) => g.broadcast_in_place(&mut r, root)?,
        (Collective::Reduce(op, root), false) => g.reduce(&s, Some(&mut r), op, root)?,
        (Collective::Reduce(op, root), true) => g.reduce_in_place(&mut r, op, root)?,
    }
    g.launch()
}

/// `op` over every rank of two host values, through the GPU.
fn across(comm: &NcclComm, vals: [f32; 2], op: ReduceOp) -> Result<[f32; 2], CommError> {
    let stream = comm.stream();
    let mut dev = stream.clone_htod(&vals).map_err(cuda("cuMemcpyHtoD"))?;
    let mut g = comm.group();
    g.all_reduce_in_place(&mut dev, op)?;
    g.launch()?.wait()?;
    let mut out = [0f32; 2];
    stream
        .memcpy_dtoh(&dev, &mut out)
        .map_err(cuda("cuMemcpyDtoH"))?;
    stream.synchronize().map_err(cuda("cuStreamSynchronize"))?;
    Ok(out)
}

fn rank_main<T: Round + DeviceRepr + ValidAsZeroBits>(
    cfg: &BenchConfig,
    call: Collective,
    comm: &NcclComm,
    report: &mut dyn FnMut(&Row),
) -> Result<(), CommError> {
    let (rank, n) = (comm.rank(), cfg.ranks);
    let max_count = cfg.count(cfg.max_bytes.max(cfg.min_bytes));
    let stream = comm.stream();
    // At least one element, and host copies exactly as long (cudarc's copies assert it).
    let len = max_count.max(1);
    let alloc = || stream.alloc_zeros::<T>(len).map_err(cuda("cuMemAlloc"));
    let (mut send, mut recv) = (alloc()?, alloc()?);
    let (mut host_send, mut host_recv) = (vec![T::default(); len], vec![T::default(); len]);
    for bytes in sizes(cfg.min_bytes, cfg.max_bytes, cfg.factor) {
        let count = cfg.count(bytes);
        let (sl, rl) = lengths(cfg.op, count, n);
        let mut m = [[0f32; 2]; 2]; // [placement][time, wrong]
        for (p, in_place) in [false, true].into_iter().enumerate() {
            let lens = if in_place { (0, count) } else { (sl, rl) };
            let mut once = || launch(comm, call, in_place, (&send, &mut recv), lens);
            for _ in 0..cfg.warmup {
                drop(once()?);
            }
            comm.barrier()?;
            let t = Instant::now();
            let mut last = None;
            for _ in 0..cfg.iters {
                last = Some(once()?);
            }
            if let Some(w) = last {
                w.wait()?;
            }
            m[p][0] = t.elapsed().as_secs_f32() / cfg.iters.max(1) as f32;
            if cfg.check {
                fill::<T>(
                    cfg.op,
                    rank,
                    n,
                    count,
                    in_place,
                    &mut host_send,
                    &mut host_recv,
                );
                // Only the first `count` elements are filled, used and checked.
                stream
                    .memcpy_htod(&host_send[..count], &mut send.slice_mut(..count))
                    .map_err(cuda("cuMemcpyHtoD"))?;
                stream
                    .memcpy_htod(&host_recv[..count], &mut recv.slice_mut(..count))
                    .map_err(cuda("cuMemcpyHtoD"))?;
                launch(comm, call, in_place, (&send, &mut recv), lens)?.wait()?;
                stream
                    .memcpy_dtoh(&recv.slice(..count), &mut host_recv[..count])
                    .map_err(cuda("cuMemcpyDtoH"))?;
                stream.synchronize().map_err(cuda("cuStreamSynchronize"))?;
                m[p][1] = wrong::<T>(cfg, rank, count, in_place, &host_recv) as f32;
            }
        }
        let times = across(comm, [m[0][0], m[1][0]], ReduceOp::Max)?;
        let wrongs = across(comm, [m[0][1], m[1][1]], ReduceOp::Sum)?;
        if rank == 0 {
            // NCCL's memory traffic is not ours to count.
            let elems = (count, T::DTYPE.size());
            report(&row(cfg, elems, times, wrongs, |_| f64::NAN));
        }
    }
    Ok(())
}
