//! The drivers that take the all-reduce as a closure, each rank on its own thread (shared
//! slots, then zero-comm's in-process backend): the lockstep bits.

use super::common::*;

/// One step of a group of `t` with each rank on its own thread, through
/// [`Gpt::tp_forward_backward`]; the all-reduce sums the ranks' buffers in rank order through
/// shared slots (two barriers: all written, all read), as [`all_reduce`] does in lockstep.
fn threaded_step(cfg: &GptConfig, t: usize, every: Option<usize>) -> Vec<(f32, Vec<Vec<f32>>)> {
    let (tokens, targets) = batch(cfg);
    let slots: Vec<Mutex<Vec<f32>>> = (0..t).map(|_| Mutex::new(Vec::new())).collect();
    let barrier = Barrier::new(t);
    let (slots, barrier, tokens, targets) = (&slots, &barrier, &tokens, &targets);
    thread::scope(|scope| {
        let handles: Vec<_> = ranks(cfg, t)
            .into_iter()
            .enumerate()
            .map(|(rank, mut r)| {
                r.acts = r.model.activations_checkpointed(B, S, every).unwrap();
                scope.spawn(move || {
                    let mut reduce = |buf: &mut [f32]| -> Result<(), GptError> {
                        slot_all_reduce(slots, barrier, rank, buf);
                        Ok(())
                    };
                    let (params, grads) = (&r.params, &mut r.grads);
                    let loss = r
                        .model
                        .tp_forward_backward(
                            &mut r.acts,
                            params,
                            grads,
                            tokens,
                            targets,
                            &mut reduce,
                        )
                        .unwrap();
                    (loss, r.grads)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn ranks_on_their_own_threads_give_the_lockstep_results_to_the_bit() {
    let cfg = config();
    let mut lockstep = ranks(&cfg, 2);
    let losses = tp_step(&mut lockstep, &cfg, all_reduce);
    // With checkpointing every block too: the recompute's reductions run in backward.
    for every in [None, Some(1)] {
        let threaded = threaded_step(&cfg, 2, every);
        for (rank, (loss, grads)) in threaded.iter().enumerate() {
            assert_eq!(loss.to_bits(), losses[rank].to_bits(), "rank {rank}'s loss");
            assert_eq!(grads, &lockstep[rank].grads, "rank {rank}'s gradients");
        }
    }
}

/// The driver with the all-reduce as a closure, each rank on its own thread, gives the
/// lockstep results to the bit.
#[test]
fn vocab_parallel_driver_on_threads_gives_the_lockstep_bits() {
    let cfg = GptConfig::new(16, 120, 2, 4, 32).unwrap();
    let params = whole_params(&cfg, true);
    let mut lockstep = ranks_from(&cfg, 2, &params, true);
    let losses = tp_step(&mut lockstep, &cfg, all_reduce);
    let (tokens, targets) = batch(&cfg);
    let slots: Vec<Mutex<Vec<f32>>> = (0..2).map(|_| Mutex::new(Vec::new())).collect();
    let barrier = Barrier::new(2);
    let (slots, barrier, tokens, targets) = (&slots, &barrier, &tokens, &targets);
    let threaded: Vec<(f32, Vec<Vec<f32>>)> = thread::scope(|scope| {
        let handles: Vec<_> = ranks_from(&cfg, 2, &params, true)
            .into_iter()
            .enumerate()
            .map(|(rank, mut r)| {
                scope.spawn(move || {
                    let mut reduce = |buf: &mut [f32]| -> Result<(), GptError> {
                        slot_all_reduce(slots, barrier, rank, buf);
                        Ok(())
                    };
                    let (params, grads) = (&r.params, &mut r.grads);
                    let loss = r
                        .model
                        .tp_vocab_forward_backward(
                            &mut r.acts,
                            params,
                            grads,
                            tokens,
                            targets,
                            &mut reduce,
                        )
                        .unwrap();
                    (loss, r.grads)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (rank, (loss, grads)) in threaded.iter().enumerate() {
        assert_eq!(loss.to_bits(), losses[rank].to_bits(), "rank {rank}'s loss");
        assert_eq!(grads, &lockstep[rank].grads, "rank {rank}'s gradients");
    }
}

/// One rank's part of a sum over threads: its buffer into its slot, then (all written)
/// the slots summed in rank order into the buffer, then (all read) done.
fn slot_all_reduce(slots: &[Mutex<Vec<f32>>], barrier: &Barrier, rank: usize, buf: &mut [f32]) {
    *slots[rank].lock().unwrap() = buf.to_vec();
    barrier.wait();
    let mut sum = vec![0.0f32; buf.len()];
    for slot in slots {
        for (s, &x) in sum.iter_mut().zip(slot.lock().unwrap().iter()) {
            *s += x;
        }
    }
    buf.copy_from_slice(&sum);
    barrier.wait();
}

/// A step's error on a rank driven by zero-comm: the model's or the collective's.
#[derive(Debug)]
enum StepError {
    Model(GptError),
    Comm(zero_comm::CommError),
}

impl From<GptError> for StepError {
    fn from(e: GptError) -> Self {
        Self::Model(e)
    }
}

impl std::fmt::Display for StepError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Model(e) => write!(f, "model: {e}"),
            Self::Comm(e) => write!(f, "all-reduce: {e}"),
        }
    }
}

/// The project's own collectives: zero-comm's in-process backend, one communicator per
/// rank on its own thread, runs the driver's all-reduces. At T = 2 a sum of two terms is
/// the same in any order, so the lockstep bits must come back, vocabulary split or not.
#[test]
fn zero_comm_all_reduce_drives_the_split_model() {
    let cfg = GptConfig::new(16, 120, 2, 4, 32).unwrap();
    let params = whole_params(&cfg, true);
    let (tokens, targets) = batch(&cfg);
    for vocab in [false, true] {
        let mut lockstep = ranks_from(&cfg, 2, &params, vocab);
        let losses = tp_step(&mut lockstep, &cfg, all_reduce);
        let comms = zero_comm::local::create(2).unwrap();
        let (tokens, targets) = (&tokens, &targets);
        let got: Vec<(f32, Vec<Vec<f32>>)> = thread::scope(|scope| {
            let handles: Vec<_> = comms
                .into_iter()
                .zip(ranks_from(&cfg, 2, &params, vocab))
                .map(|(comm, mut r)| {
                    scope.spawn(move || {
                        let mut reduce = |buf: &mut [f32]| -> Result<(), StepError> {
                            let sum = zero_comm::ReduceOp::Sum;
                            comm.all_reduce_in_place(buf, sum).map_err(StepError::Comm)
                        };
                        let (m, acts, p, g) = (&r.model, &mut r.acts, &r.params, &mut r.grads);
                        let loss = if vocab {
                            m.tp_vocab_forward_backward(acts, p, g, tokens, targets, &mut reduce)
                        } else {
                            m.tp_forward_backward(acts, p, g, tokens, targets, &mut reduce)
                        };
                        (loss.unwrap_or_else(|e| panic!("{e}")), r.grads)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (rank, (loss, grads)) in got.iter().enumerate() {
            assert_eq!(
                loss.to_bits(),
                losses[rank].to_bits(),
                "vocab {vocab} rank {rank}"
            );
            assert_eq!(grads, &lockstep[rank].grads, "vocab {vocab} rank {rank}");
        }
    }
}
