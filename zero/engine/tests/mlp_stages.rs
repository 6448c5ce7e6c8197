//! The engine proves itself on a model that is not the GPT (`examples/mlp`): every stage
//! trains to the same bits at 1-4 ranks in fp32 and bf16; activation checkpointing (its kept
//! inputs in the arena or offloaded to pinned host memory) and optimizer offload change no
//! bit; every rank's arena peaks exactly at its memory plan; a
//! forward-only pass is declared and planned like training.

#[path = "../examples/mlp/model.rs"]
#[allow(dead_code)]
mod model;

use model::{init, micro_batch, Mlp, Shape};
use zero::{Engine, EngineConfig, Precision, ZeroStage};

const SHAPE: Shape = Shape {
    inputs: 6,
    hidden: 24,
    classes: 3,
    blocks: 5,
    batch: 4,
};
const STEPS: usize = 3;
const ACCUM: usize = 2;

/// What a run gives: every rank's losses, rank 0's final parameters and norms, and each
/// rank's (measured peak, planned total) bytes.
#[derive(Debug)]
struct Run {
    losses: Vec<Vec<f32>>,
    params: Vec<Vec<f32>>,
    norms: Vec<f32>,
    peaks: Vec<(u64, u64)>,
}

fn run(world: usize, config: EngineConfig, every: Option<usize>) -> Run {
    let comms = zero_comm::local::create(world).unwrap();
    let ranks: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .into_iter()
            .map(|c| s.spawn(move || rank_run(c, config, every)))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let (params, norms) = (ranks[0].1.clone(), ranks[0].2.clone());
    Run {
        losses: ranks.iter().map(|r| r.0.clone()).collect(),
        params,
        norms,
        peaks: ranks.iter().map(|r| r.3).collect(),
    }
}

type RankRun = (Vec<f32>, Vec<Vec<f32>>, Vec<f32>, (u64, u64));

fn rank_run(comm: zero_comm::Communicator, config: EngineConfig, every: Option<usize>) -> RankRun {
    let (train, eval) = (SHAPE.train_program(every), SHAPE.forward_program());
    let rank = comm.rank();
    let programs = [train.schedule(), eval.schedule()];
    let mut e = Engine::new(comm, SHAPE.units(), &programs, config, |u, w| {
        init(&SHAPE, u, w)
    })
    .unwrap();
    let mut mlp = Mlp::new(SHAPE, every, vec![], vec![]);
    let (mut losses, mut norms) = (vec![], vec![]);
    for step in 0..STEPS {
        for micro in 0..ACCUM {
            let (x, y) = micro_batch(&SHAPE, step, micro, rank);
            mlp.set_batch(x, y);
            e.micro_step(&train, &mut mlp).unwrap();
            losses.push(mlp.loss);
        }
        norms.push(e.step(1e-2).unwrap().grad_norm);
        let (x, y) = micro_batch(&SHAPE, 99, step, rank);
        mlp.set_batch(x, y);
        e.forward(&eval, &mut mlp).unwrap();
        losses.push(mlp.loss);
    }
    let params = (0..SHAPE.blocks + 2)
        .map(|u| e.read_params(u).unwrap())
        .collect();
    let peak = (
        e.arena().stats().peak_allocated as u64,
        e.memory_plan().total(),
    );
    (losses, params, norms, peak)
}

fn config(stage: ZeroStage, precision: Precision) -> EngineConfig {
    EngineConfig {
        stage,
        precision,
        grad_clip: 0.5,
        // Small buckets: units reduce in several pieces.
        reduce_bucket_bytes: 256,
        kept_inputs: SHAPE.kept_inputs(false),
        ..EngineConfig::default()
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn assert_same(a: &Run, b: &Run, what: &str) {
    assert_eq!(a.losses.len(), b.losses.len(), "{what}");
    for (x, y) in a.losses.iter().zip(&b.losses) {
        assert_eq!(bits(x), bits(y), "{what}: losses");
    }
    for (x, y) in a.params.iter().zip(&b.params) {
        assert_eq!(bits(x), bits(y), "{what}: parameters");
    }
    assert_eq!(bits(&a.norms), bits(&b.norms), "{what}: norms");
}

#[test]
fn every_stage_trains_to_the_same_bits_at_one_to_four_ranks() {
    for precision in [Precision::Fp32, Precision::Bf16] {
        for world in 1..=4 {
            let base = run(world, config(ZeroStage::Zero0, precision), None);
            assert!(base.losses[0].iter().all(|l| l.is_finite()));
            for stage in [ZeroStage::Zero1, ZeroStage::Zero2, ZeroStage::Zero3] {
                let other = run(world, config(stage, precision), None);
                assert_same(&base, &other, &format!("{precision:?} N={world} {stage}"));
            }
        }
    }
}

#[test]
fn checkpointing_and_optimizer_offload_change_no_bit() {
    for stage in ZeroStage::ALL {
        let plain = run(2, config(stage, Precision::Fp32), None);
        for every in [1, 2, 3] {
            let ckpt = run(2, config(stage, Precision::Fp32), Some(every));
            assert_same(&plain, &ckpt, &format!("{stage} checkpoint every {every}"));
        }
        let offload = EngineConfig {
            offload_optimizer: true,
            ..config(stage, Precision::Fp32)
        };
        let off = run(2, offload, Some(2));
        assert_same(&plain, &off, &format!("{stage} optimizer offload"));
        for every in [1, 2] {
            let kept_offload = EngineConfig {
                kept_inputs: SHAPE.kept_inputs(true),
                ..offload
            };
            let both = run(2, kept_offload, Some(every));
            let what = format!("{stage} checkpoint every {every}, kept inputs offloaded");
            assert_same(&plain, &both, &what);
        }
    }
}

#[test]
fn every_ranks_arena_peaks_exactly_at_its_plan_on_the_widest_rank() {
    for precision in [Precision::Fp32, Precision::Bf16] {
        for stage in ZeroStage::ALL {
            for (world, offload) in [(1, false), (3, false), (2, true)] {
                let config = EngineConfig {
                    kept_inputs: SHAPE.kept_inputs(offload),
                    ..config(stage, precision)
                };
                let r = run(world, config, Some(2));
                let (peak, plan) = r.peaks[0];
                assert_eq!(peak, plan, "{precision:?} {stage} N={world}: rank 0");
                for (rank, &(peak, plan)) in r.peaks.iter().enumerate() {
                    assert!(peak <= plan, "{precision:?} {stage} N={world}: rank {rank}");
                }
            }
        }
    }
}
