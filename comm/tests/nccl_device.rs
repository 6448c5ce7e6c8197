//! The NCCL communicator on a real GPU, at world size 1 (a one-GPU machine): every collective's
//! result and NCCL's in-place layouts, f32 and bf16, plus split and barrier. With one rank each
//! collective's expected value is written out here (a sum, max, min or average over one rank is
//! the input; a gather or scatter is a copy), so a wrong pointer, offset or dtype shows.
//! The failure that one GPU can show: a group whose other rank never joins fails within its
//! timeout instead of hanging.
//!
//! Without a GPU or NCCL every test prints that it skipped; `ZERO_COMM_REQUIRE_GPU=1` (set by
//! scripts/gpu-check.sh) turns that into a failure. Nothing here has run on a GPU yet.
#![cfg(feature = "cuda")]

use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::{CudaSlice, CudaStream};
use half::bf16;
use zero_comm::nccl::{self, NcclComm};
use zero_comm::{CommError, Config, ReduceOp};

/// A world-size-1 communicator on GPU 0, or `None` (after saying why) where none can be had.
fn single_rank() -> Option<NcclComm> {
    let made = nccl::new_id().and_then(|id| NcclComm::from_id(&id, 0, 1, 0, Config::default()));
    match made {
        Ok(comm) => Some(comm),
        Err(e) if std::env::var_os("ZERO_COMM_REQUIRE_GPU").is_none() => {
            eprintln!("skipped: no NCCL communicator on this machine ({e})");
            None
        }
        Err(e) => panic!("ZERO_COMM_REQUIRE_GPU is set but NCCL is unavailable: {e}"),
    }
}

fn upload<T: cudarc::driver::DeviceRepr>(s: &Arc<CudaStream>, host: &[T]) -> CudaSlice<T> {
    s.clone_htod(host).expect("upload")
}

fn download<T: cudarc::driver::DeviceRepr + Default + Clone>(
    s: &Arc<CudaStream>,
    dev: &CudaSlice<T>,
) -> Vec<T> {
    s.clone_dtoh(dev).expect("download")
}

fn input(n: usize) -> Vec<f32> {
    (0..n).map(|i| (i as f32) * 0.5 - 3.0).collect()
}

#[test]
fn every_reduction_of_one_rank_is_its_input() {
    let Some(comm) = single_rank() else { return };
    let s = comm.stream().clone();
    let host = input(37);
    for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min] {
        let send = upload(&s, &host);
        let mut recv = upload(&s, &vec![f32::NAN; host.len()]);
        let mut g = comm.group();
        g.all_reduce(&send, &mut recv, op).unwrap();
        g.launch().unwrap().wait().unwrap();
        assert_eq!(download(&s, &recv), host, "all_reduce {op:?}");

        let mut buf = upload(&s, &host);
        let mut g = comm.group();
        g.all_reduce_in_place(&mut buf, op).unwrap();
        g.launch().unwrap().wait().unwrap();
        assert_eq!(download(&s, &buf), host, "all_reduce_in_place {op:?}");

        let mut root = upload(&s, &vec![f32::NAN; host.len()]);
        let mut g = comm.group();
        g.reduce(&send, Some(&mut root), op, 0).unwrap();
        g.launch().unwrap().wait().unwrap();
        assert_eq!(download(&s, &root), host, "reduce {op:?}");
    }
}

#[test]
fn scatter_gather_and_broadcast_copy_with_nccl_layouts() {
    let Some(comm) = single_rank() else { return };
    let s = comm.stream().clone();
    let host = input(64);
    let send = upload(&s, &host);
    let mut rs = upload(&s, &vec![f32::NAN; 64]);
    let mut ag = upload(&s, &vec![f32::NAN; 64]);
    let mut bc = upload(&s, &vec![f32::NAN; 64]);
    let mut g = comm.group();
    g.reduce_scatter(&send, &mut rs, ReduceOp::Sum).unwrap();
    g.all_gather(&send, &mut ag).unwrap();
    g.broadcast(Some(&send), &mut bc, 0).unwrap();
    g.launch().unwrap().wait().unwrap();
    for (name, got) in [
        ("reduce_scatter", &rs),
        ("all_gather", &ag),
        ("broadcast", &bc),
    ] {
        assert_eq!(download(&s, got), host, "{name} (grouped launch)");
    }
    // A group may not name one buffer twice (the borrow checker refuses it), so the in-place
    // forms run one group each.
    let mut inplace = upload(&s, &host);
    let mut g = comm.group();
    g.reduce_scatter_in_place(&mut inplace, ReduceOp::Sum)
        .unwrap();
    g.launch().unwrap().wait().unwrap();
    let mut g = comm.group();
    g.all_gather_in_place(&mut inplace).unwrap();
    g.launch().unwrap().wait().unwrap();
    let mut g = comm.group();
    g.broadcast_in_place(&mut inplace, 0).unwrap();
    g.launch().unwrap().wait().unwrap();
    assert_eq!(download(&s, &inplace), host, "in-place chain");
}

#[test]
fn bf16_moves_its_bits_unchanged() {
    let Some(comm) = single_rank() else { return };
    let s = comm.stream().clone();
    let host: Vec<bf16> = input(33).into_iter().map(bf16::from_f32).collect();
    let send = upload(&s, &host);
    let mut recv = upload(&s, &vec![bf16::ZERO; host.len()]);
    let mut g = comm.group();
    g.all_reduce(&send, &mut recv, ReduceOp::Sum).unwrap();
    g.launch().unwrap().wait().unwrap();
    let got: Vec<u16> = download(&s, &recv).iter().map(|x| x.to_bits()).collect();
    let want: Vec<u16> = host.iter().map(|x| x.to_bits()).collect();
    assert_eq!(got, want);
}

#[test]
fn wrong_lengths_are_refused_before_nccl_sees_them() {
    let Some(comm) = single_rank() else { return };
    let s = comm.stream().clone();
    let send = upload(&s, &input(8));
    let mut short = upload(&s, &[0.0f32; 7]);
    let mut g = comm.group();
    assert!(g.all_reduce(&send, &mut short, ReduceOp::Sum).is_err());
    // The refused call left the communicator usable.
    comm.barrier().unwrap();
}

#[test]
fn split_and_barrier_work_at_world_size_one() {
    let Some(comm) = single_rank() else { return };
    let sub = comm.split(0, 0).unwrap();
    assert_eq!((sub.rank(), sub.size()), (0, 1));
    sub.barrier().unwrap();
    comm.barrier().unwrap();
}

/// Rank 0 of a group of 2 whose rank 1 never starts (one GPU is enough): creating the
/// communicator fails with the join timeout, naming the rank and the missing peers, and NCCL
/// stays usable after the abort. scripts/gpu-check.sh runs it in a step of its own, since it
/// waits out the timeout.
#[test]
fn a_group_whose_peer_never_joins_fails_within_its_timeout() {
    let Some(working) = single_rank() else { return };
    drop(working);
    let id = nccl::new_id().expect("unique id");
    let config = Config::with_timeout(Duration::from_secs(5));
    match NcclComm::from_id(&id, 0, 2, 0, config) {
        Err(CommError::Unavailable { why, .. }) => assert!(
            why.contains("rank 0 of 2") && why.contains("not every rank joined"),
            "{why}"
        ),
        Err(e) => panic!("expected the join timeout, got {e}"),
        Ok(_) => panic!("a group of 2 formed with one rank"),
    }
    let again = single_rank().expect("NCCL after an aborted creation");
    again.barrier().unwrap();
}
