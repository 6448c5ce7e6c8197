//! Trains the residual MLP split Megatron-style over a tensor-parallel group (`model.rs`)
//! beside ZeRO over the data-parallel one, on a grid of T x 2 in-process ranks, and prints one
//! line per T and stage: `T=N stage S: ` and the mean loss of each optimizer step. T = 1 is the
//! un-split model; at T = 2 each block's sums are split in two and summed after, so its losses
//! agree with T = 1's to about 1e-6, not to the bit, while its stages agree to the bit.
//!
//! `cargo run --release -p zero --example mlp_tp`

#[path = "../mlp/model.rs"]
#[allow(dead_code)]
mod mlp;
mod model;

use mlp::{micro_batch, Shape};
use model::{TpMlp, TpShape};
use zero::tensor_parallel::Grid;
use zero::{Engine, EngineConfig, ZeroStage};
use zero_comm::ReduceOp;

const NET: Shape = Shape {
    inputs: 12,
    hidden: 32,
    classes: 5,
    blocks: 4,
    batch: 8,
};
const DP: usize = 2;
const STEPS: usize = 8;

/// One rank's losses: the mean over the data-parallel ranks of each step's loss.
fn rank_losses(
    world: zero_comm::Communicator,
    tp: usize,
    stage: ZeroStage,
) -> Result<Vec<f32>, zero::Error> {
    let grid = Grid::new(&world, tp)?;
    let shape = TpShape {
        net: NET,
        tp,
        tp_rank: grid.tp.rank(),
    };
    let train = shape.train_program();
    let dp_index = grid.dp.rank();
    let config = EngineConfig {
        stage,
        ..EngineConfig::default()
    };
    let mut engine = Engine::new(
        grid.dp,
        shape.units(),
        &[train.schedule()],
        config,
        |u, w| shape.init(u, w),
    )?
    .with_tensor_parallel(grid.tp.split(0, 0)?);
    let mut mlp = TpMlp::new(shape, grid.tp);
    let mut losses = Vec::with_capacity(STEPS);
    for step in 0..STEPS {
        let (x, labels) = micro_batch(&NET, step, 0, dp_index);
        mlp.set_batch(x, labels);
        engine.micro_step(&train, &mut mlp)?;
        let mut loss = [mlp.loss];
        engine
            .comm()
            .all_reduce_in_place(&mut loss, ReduceOp::Avg)?;
        engine.step(1e-2)?;
        losses.push(loss[0]);
    }
    Ok(losses)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for tp in [1, 2] {
        for stage in ZeroStage::ALL {
            let comms = zero_comm::local::create(tp * DP)?;
            let ranks = std::thread::scope(|s| {
                let handles: Vec<_> = comms
                    .into_iter()
                    .map(|comm| s.spawn(move || rank_losses(comm, tp, stage)))
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().expect("a rank thread panicked"))
                    .collect::<Result<Vec<_>, _>>()
            })?;
            let line: Vec<String> = ranks[0].iter().map(|l| format!("{l:?}")).collect();
            println!("T={tp} stage {}: {}", stage as u8, line.join(" "));
        }
    }
    Ok(())
}
