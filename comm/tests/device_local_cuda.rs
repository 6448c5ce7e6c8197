//! The device-local protocol on a real GPU (`CudaOps`): 2 and 4 rank threads sharing device 0,
//! every collective in and out of place on random f32, bf16 and f16 inputs, each rank's
//! result copied back and compared bitwise with a naive reference written here (widen with
//! the `half` crate, combine in rank order in f32, divide once for Avg, round once).
//!
//! Without a driver, a GPU or NVRTC each test prints why it skipped and passes, unless
//! `ZERO_COMM_REQUIRE_GPU` is set or `ZERO_GPT_REQUIRE_GPU=1` (both set by
//! scripts/gpu-check.sh), which makes the skip a failure.
#![cfg(feature = "cuda")]

use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::{CudaContext, CudaSlice, DeviceRepr};
use half::{bf16, f16};
use zero_comm::device_local::cuda::{self, CudaOps};
use zero_comm::device_local::DeviceLocalComm;
use zero_comm::{Collective, CommError, Config, Element, ReduceOp};

/// Elements of each rank's chunk for reduce-scatter and all-gather (more than one block).
const PER: usize = 257;
/// Elements of all-reduce and broadcast: no multiple of 2 or 4, so the chunks are uneven.
const WHOLE: usize = 1001;
/// What an out-of-place recv holds before the call; no input or result equals it.
const SENTINEL: f32 = -1234.5;

fn required() -> bool {
    std::env::var_os("ZERO_COMM_REQUIRE_GPU").is_some()
        || std::env::var("ZERO_GPT_REQUIRE_GPU").as_deref() == Ok("1")
}

/// Device 0 with the reduction kernel loadable, or why not. cudarc panics on the first call
/// into a driver library it cannot load, so the library's presence is checked first.
fn probe() -> Result<Arc<CudaContext>, String> {
    // SAFETY: only tries to dlopen the driver library's file names; calls no CUDA function.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err("the CUDA driver library (libcuda.so) was not found".into());
    }
    let ctx =
        zero_alloc::context::untracked_context(0).map_err(|e| format!("no CUDA device 0: {e}"))?;
    cuda::create(&ctx, 1, Config::default()).map_err(|e| e.to_string())?;
    Ok(ctx)
}

fn gpu(test: &str) -> Option<Arc<CudaContext>> {
    match probe() {
        Ok(ctx) => Some(ctx),
        Err(why) if required() => panic!("{test}: a GPU is required but {why}"),
        Err(why) => {
            println!("{test}: skipped: {why}");
            None
        }
    }
}

/// An element type with conversions taken from `half`, not from `zero_comm`.
trait Num: Element + DeviceRepr {
    fn widen(self) -> f32;
    fn narrow(x: f32) -> Self;
    fn bits(self) -> u32;
}

impl Num for f32 {
    fn widen(self) -> f32 {
        self
    }
    fn narrow(x: f32) -> Self {
        x
    }
    fn bits(self) -> u32 {
        self.to_bits()
    }
}

/// The 16-bit types: `half`'s own conversions (round to nearest even).
macro_rules! num_from_half {
    ($($t:ty),*) => {$(
        impl Num for $t {
            fn widen(self) -> f32 {
                <$t>::to_f32(self)
            }
            fn narrow(x: f32) -> Self {
                <$t>::from_f32(x)
            }
            fn bits(self) -> u32 {
                u32::from(self.to_bits())
            }
        }
    )*};
}

num_from_half!(bf16, f16);

/// Rank `rank`'s input to case `case` of a `world`-rank group: splitmix64 values in
/// [-10, 10) with all 24 mantissa bits random, rounded to `T`.
fn input<T: Num>(world: usize, rank: usize, case: usize, len: usize) -> Vec<T> {
    let mut state = (world * 1_000_003 + rank * 10_007 + case) as u64;
    (0..len)
        .map(|_| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            let unit = ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 24) as f32;
            T::narrow(unit * 20.0 - 10.0)
        })
        .collect()
}

#[derive(Debug, Clone, Copy)]
struct Case {
    call: Collective,
    in_place: bool,
}

impl Case {
    /// (send, recv) lengths of the out-of-place form; the in-place buffer is the longer.
    fn lens(&self, world: usize) -> (usize, usize) {
        match self.call {
            Collective::ReduceScatter(_) => (PER * world, PER),
            Collective::AllGather => (PER, PER * world),
            _ => (WHOLE, WHOLE),
        }
    }
}

fn cases(world: usize) -> Vec<Case> {
    let ops = [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min];
    let calls = ops
        .iter()
        .flat_map(|&op| [Collective::AllReduce(op), Collective::ReduceScatter(op)])
        .chain([Collective::AllGather, Collective::Broadcast(world - 1)]);
    calls
        .flat_map(|call| [false, true].map(|in_place| Case { call, in_place }))
        .collect()
}

/// Runs every case on one rank, in order on its stream; returns its results.
fn rank_results<T: Num>(mut comm: DeviceLocalComm<CudaOps>, cases: &[Case]) -> Vec<Vec<T>> {
    let stream = Arc::clone(comm.ops().stream());
    let (rank, world) = (comm.rank(), comm.size());
    let mut results = Vec::new();
    for (k, case) in cases.iter().enumerate() {
        let (send_len, recv_len) = case.lens(world);
        let mine = input::<T>(world, rank, k, send_len);
        let mut host = vec![T::narrow(SENTINEL); send_len.max(recv_len)];
        let at = match (case.in_place, case.call) {
            (false, _) => None,
            (true, Collective::AllGather) => Some(rank * PER),
            (true, _) => Some(0),
        };
        if let Some(at) = at {
            host[at..at + send_len].copy_from_slice(&mine);
        } else {
            host.truncate(recv_len);
        }
        let mut recv = stream.clone_htod(&host).expect("upload recv");
        let done = if case.in_place {
            comm.run(case.call, None::<&CudaSlice<T>>, &mut recv)
        } else {
            let send = stream.clone_htod(&mine).expect("upload send");
            comm.run(case.call, Some(&send), &mut recv)
        };
        done.unwrap_or_else(|e| panic!("rank {rank} {case:?}: {e}"));
        let out = stream.clone_dtoh(&recv).expect("download");
        results.push(match (case.in_place, case.call) {
            (true, Collective::ReduceScatter(_)) => out[rank * PER..(rank + 1) * PER].to_vec(),
            _ => out,
        });
    }
    results
}

/// Element-wise reduction of `inputs[r][range]` over r: widen, combine in rank order, round once.
fn naive<T: Num>(inputs: &[Vec<T>], op: ReduceOp, range: std::ops::Range<usize>) -> Vec<T> {
    range
        .map(|i| {
            let mut acc = inputs[0][i].widen();
            for x in inputs[1..].iter().map(|v| v[i].widen()) {
                acc = match op {
                    ReduceOp::Sum | ReduceOp::Avg => acc + x,
                    ReduceOp::Max => acc.max(x),
                    ReduceOp::Min => acc.min(x),
                };
            }
            if op == ReduceOp::Avg {
                acc /= inputs.len() as f32;
            }
            T::narrow(acc)
        })
        .collect()
}

fn expected<T: Num>(call: Collective, inputs: &[Vec<T>], rank: usize) -> Vec<T> {
    match call {
        Collective::AllReduce(op) => naive(inputs, op, 0..WHOLE),
        Collective::ReduceScatter(op) => naive(inputs, op, rank * PER..(rank + 1) * PER),
        Collective::AllGather => inputs.concat(),
        Collective::Broadcast(root) => inputs[root].clone(),
        Collective::Reduce(..) => unreachable!("not among the cases"),
    }
}

fn bits<T: Num>(v: &[T]) -> Vec<u32> {
    v.iter().map(|&x| x.bits()).collect()
}

fn check_world<T: Num>(ctx: &Arc<CudaContext>, world: usize) {
    let comms = cuda::create(ctx, world, Config::with_timeout(Duration::from_secs(20)))
        .expect("create the group");
    let cases = cases(world);
    let results: Vec<Vec<Vec<T>>> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|c| s.spawn(|| rank_results::<T>(c, &cases)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (k, case) in cases.iter().enumerate() {
        let send_len = case.lens(world).0;
        let inputs: Vec<Vec<T>> = (0..world).map(|r| input(world, r, k, send_len)).collect();
        for (rank, got) in results.iter().enumerate() {
            let want = expected(case.call, &inputs, rank);
            assert!(
                bits(&got[k]) == bits(&want),
                "{} world {world} rank {rank} {case:?}: results differ from the reference",
                std::any::type_name::<T>()
            );
        }
    }
}

#[test]
fn every_collective_on_2_and_4_ranks_matches_the_naive_reference_bitwise() {
    let Some(ctx) = gpu("every_collective_on_2_and_4_ranks_matches_the_naive_reference_bitwise")
    else {
        return;
    };
    for world in [2, 4] {
        check_world::<f32>(&ctx, world);
        check_world::<bf16>(&ctx, world);
        check_world::<f16>(&ctx, world);
    }
}

#[test]
fn ranks_that_disagree_on_the_length_all_get_an_error() {
    let Some(ctx) = gpu("ranks_that_disagree_on_the_length_all_get_an_error") else {
        return;
    };
    let comms = cuda::create(&ctx, 2, Config::with_timeout(Duration::from_secs(10))).unwrap();
    let results: Vec<Result<(), CommError>> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|mut c| {
                s.spawn(move || {
                    let stream = Arc::clone(c.ops().stream());
                    let mut x = stream.clone_htod(&vec![1.0f32; 4 + c.rank()]).unwrap();
                    c.run(
                        Collective::AllReduce(ReduceOp::Sum),
                        None::<&CudaSlice<f32>>,
                        &mut x,
                    )
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (r, res) in results.iter().enumerate() {
        assert!(
            matches!(res, Err(CommError::Mismatch { field: "count", .. })),
            "rank {r}: {res:?}"
        );
    }
}
