//! Trains a small residual MLP (`model.rs`, host kernels written for it) through the ZeRO
//! engine at stages 0-3 on two in-process ranks, with activation checkpointing every two
//! blocks (the segments' inputs offloaded to pinned host memory by the engine) and the
//! optimizer states offloaded to a host arena, and prints one line per stage:
//! `stage N: `, the loss of each optimizer step (the ranks' mean), then the loss of a
//! forward-only pass on a held-out batch after training, each printed with the fewest digits
//! that read back to the same f32, so equal lines mean equal bits.
//!
//! `cargo run --release -p zero --example mlp`

// `Mlp::forward_backward` (training without an engine) serves the engine's reference test,
// tests/mlp_reference.rs, not this program.
#[allow(dead_code)]
mod model;

use model::{init, micro_batch, Mlp, Shape};
use zero::{Engine, EngineConfig, ZeroStage};
use zero_comm::ReduceOp;

const SHAPE: Shape = Shape {
    inputs: 12,
    hidden: 32,
    classes: 5,
    blocks: 4,
    batch: 8,
};
const WORLD: usize = 2;
const STEPS: usize = 10;
const ACCUM: usize = 2;
const CHECKPOINT_EVERY: Option<usize> = Some(2);

/// One rank's run at `stage`: the mean loss of each step over every rank and micro-step,
/// then the held-out loss.
fn rank_losses(comm: zero_comm::Communicator, stage: ZeroStage) -> Result<Vec<f32>, zero::Error> {
    let (train, eval) = (
        SHAPE.train_program(CHECKPOINT_EVERY),
        SHAPE.forward_program(),
    );
    let config = EngineConfig {
        stage,
        offload_optimizer: true,
        kept_inputs: SHAPE.kept_inputs(true),
        ..EngineConfig::default()
    };
    let rank = comm.rank();
    let programs = [train.schedule(), eval.schedule()];
    let mut engine = Engine::new(comm, SHAPE.units(), &programs, config, |u, w| {
        init(&SHAPE, u, w)
    })?;
    let mut mlp = Mlp::new(SHAPE, CHECKPOINT_EVERY, vec![], vec![]);
    let mut losses = Vec::with_capacity(STEPS);
    for step in 0..STEPS {
        let mut sum = 0.0;
        for micro in 0..ACCUM {
            let (x, labels) = micro_batch(&SHAPE, step, micro, rank);
            mlp.set_batch(x, labels);
            engine.micro_step(&train, &mut mlp)?;
            sum += mlp.loss;
        }
        let mut loss = [sum / ACCUM as f32];
        engine
            .comm()
            .all_reduce_in_place(&mut loss, ReduceOp::Avg)?;
        engine.step(3e-2)?;
        losses.push(loss[0]);
    }
    let (x, labels) = micro_batch(&SHAPE, STEPS, 0, rank);
    mlp.set_batch(x, labels);
    engine.forward(&eval, &mut mlp)?;
    let mut loss = [mlp.loss];
    engine
        .comm()
        .all_reduce_in_place(&mut loss, ReduceOp::Avg)?;
    losses.push(loss[0]);
    Ok(losses)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for stage in ZeroStage::ALL {
        let comms = zero_comm::local::create(WORLD)?;
        let ranks = std::thread::scope(|s| {
            let handles: Vec<_> = comms
                .into_iter()
                .map(|comm| s.spawn(move || rank_losses(comm, stage)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("a rank thread panicked"))
                .collect::<Result<Vec<_>, _>>()
        })?;
        let line: Vec<String> = ranks[0].iter().map(|l| format!("{l:?}")).collect();
        println!("stage {}: {}", stage as u8, line.join(" "));
    }
    Ok(())
}
