//! The engine at every stage against an independent reference that shares none of its
//! partitioning, bucketing, reduction, accumulation, norm or optimizer code, on the MLP of
//! `examples/mlp` (its whole-buffer `forward_backward` gives each rank's gradients).
//!
//! The reference writes out, element by element, the arithmetic the engine promises:
//! - the local backend's average: the ranks' f32 gradients summed in rank order in f32, then
//!   divided by N;
//! - accumulation over micro-steps: `acc = acc + avg` in f32, from zero;
//! - the mean over micro-steps and the clip folded into the gradient: `(g * (1/k)) * clip`;
//! - the global norm: per rank, the squares (in f64) of that rank's shard of every unit, units
//!   in order, summed in f64; each partial carried as an (f32 hi, f32 lo) pair, as the engine
//!   exchanges it; partials added in rank order; square root;
//! - clip coefficient `min(max_norm / (norm + 1e-6), 1)`, torch's formula;
//! - AdamW as torch computes it, bias corrections in f64 rounded to f32.
//!
//! Shards follow the documented rule (pad each unit to a multiple of `N * SHARD_ALIGN_ELEMS`,
//! equal shards), cut here independently.

#[path = "../examples/mlp/model.rs"]
#[allow(dead_code)]
mod model;

use model::{init, micro_batch, Mlp, Shape};
use zero::{Engine, EngineConfig, ZeroStage, SHARD_ALIGN_ELEMS};

const SHAPE: Shape = Shape {
    inputs: 7,
    hidden: 20,
    classes: 4,
    blocks: 3,
    batch: 3,
};
const ACCUM: usize = 2;
/// Learning rate of each optimizer step (varied so Adam's step size differs per step).
const LRS: [f32; 3] = [1e-2, 3e-2, 2e-2];
/// Between the steps' gradient norms, so some steps clip and some do not (checked below).
const GRAD_CLIP: f32 = 0.9;

/// What a run did: per step the norm, the clip coefficient and every unit's parameters.
#[derive(Debug, Default)]
struct Trace {
    norms: Vec<f32>,
    clips: Vec<f32>,
    params: Vec<Vec<Vec<f32>>>,
}

fn units_params() -> Vec<Vec<f32>> {
    SHAPE
        .units()
        .iter()
        .enumerate()
        .map(|(u, spec)| {
            let mut w = vec![0.0; spec.numel];
            init(&SHAPE, u, &mut w);
            w
        })
        .collect()
}

/// Rank `r`'s real elements of a unit of `numel` elements split over `world` ranks.
fn data_shard(numel: usize, world: usize, r: usize) -> std::ops::Range<usize> {
    let quantum = world * SHARD_ALIGN_ELEMS;
    let shard_len = numel.div_ceil(quantum) * quantum / world;
    (r * shard_len).min(numel)..((r + 1) * shard_len).min(numel)
}

/// Every rank's gradients of micro-step `micro` of `step`, averaged: summed in rank order in
/// f32, then divided by N.
fn averaged_grads(params: &[Vec<f32>], world: usize, step: usize, micro: usize) -> Vec<Vec<f32>> {
    let per_rank: Vec<Vec<Vec<f32>>> = (0..world)
        .map(|rank| {
            let (x, y) = micro_batch(&SHAPE, step, micro, rank);
            let mut mlp = Mlp::new(SHAPE, None, x, y);
            let mut grads: Vec<Vec<f32>> = params.iter().map(|p| vec![0.0; p.len()]).collect();
            mlp.forward_backward(params, &mut grads).unwrap();
            grads
        })
        .collect();
    let mut avg = per_rank[0].clone();
    for (u, unit) in avg.iter_mut().enumerate() {
        for (i, out) in unit.iter_mut().enumerate() {
            let mut sum = per_rank[0][u][i];
            for rank_grads in &per_rank[1..] {
                sum += rank_grads[u][i];
            }
            *out = sum / world as f32;
        }
    }
    avg
}

/// The global norm of `grads * factor`, from per-rank partial sums as the engine combines them.
fn global_norm(grads: &[Vec<f32>], factor: f32, world: usize) -> f64 {
    let mut total = 0f64;
    for r in 0..world {
        let mut partial = 0f64;
        for unit in grads {
            for &g in &unit[data_shard(unit.len(), world, r)] {
                let x = f64::from(g * factor);
                partial += x * x;
            }
        }
        let hi = partial as f32;
        let lo = (partial - f64::from(hi)) as f32;
        total += f64::from(hi) + f64::from(lo);
    }
    total.sqrt()
}

/// Which elements of each unit take weight decay, from the unit specs' decay ranges.
fn decay_masks() -> Vec<Vec<bool>> {
    SHAPE
        .units()
        .iter()
        .map(|spec| {
            let mut mask = vec![false; spec.numel];
            for range in &spec.decay {
                mask[range.clone()].fill(true);
            }
            mask
        })
        .collect()
}

/// torch.optim.AdamW, element by element; `t` counts from 1.
fn adamw(params: &mut [Vec<f32>], grads: &[Vec<f32>], mv: &mut [Vec<(f32, f32)>], t: i32, lr: f32) {
    let opt = EngineConfig::default().adam;
    let (b1, b2, eps, wd) = (opt.beta1, opt.beta2, opt.eps, opt.weight_decay);
    let step_size = (f64::from(lr) / (1.0 - f64::from(b1).powi(t))) as f32;
    let inv_sqrt_bc2 = (1.0 / (1.0 - f64::from(b2).powi(t)).sqrt()) as f32;
    let decays = decay_masks();
    for u in 0..params.len() {
        for i in 0..params[u].len() {
            let g = grads[u][i];
            let (m0, v0) = mv[u][i];
            let m = b1 * m0 + (1.0 - b1) * g;
            let v = b2 * v0 + (1.0 - b2) * g * g;
            mv[u][i] = (m, v);
            let denom = v.sqrt() * inv_sqrt_bc2 + eps;
            let decay = if decays[u][i] { 1.0 - lr * wd } else { 1.0 };
            params[u][i] = params[u][i] * decay - step_size * (m / denom);
        }
    }
}

fn reference(world: usize) -> Trace {
    let mut params = units_params();
    let mut mv: Vec<Vec<(f32, f32)>> = params.iter().map(|p| vec![(0.0, 0.0); p.len()]).collect();
    let mut trace = Trace::default();
    for (step, &lr) in LRS.iter().enumerate() {
        let mut acc: Vec<Vec<f32>> = params.iter().map(|p| vec![0.0; p.len()]).collect();
        for micro in 0..ACCUM {
            let avg = averaged_grads(&params, world, step, micro);
            for (a, g) in acc.iter_mut().flatten().zip(avg.iter().flatten()) {
                *a += *g;
            }
        }
        let factor = 1.0 / ACCUM as f32;
        let norm = global_norm(&acc, factor, world);
        let clip = (f64::from(GRAD_CLIP) / (norm + 1e-6)).min(1.0) as f32;
        for g in acc.iter_mut().flatten() {
            *g = *g * factor * clip;
        }
        adamw(&mut params, &acc, &mut mv, step as i32 + 1, lr);
        trace.norms.push(norm as f32);
        trace.clips.push(clip);
        trace.params.push(params.clone());
    }
    trace
}

fn engine_rank(comm: zero_comm::Communicator, stage: ZeroStage) -> Trace {
    let train = SHAPE.train_program(None);
    let config = EngineConfig {
        stage,
        grad_clip: GRAD_CLIP,
        ..EngineConfig::default()
    };
    let rank = comm.rank();
    let mut e = Engine::new(comm, SHAPE.units(), &[train.schedule()], config, |u, w| {
        init(&SHAPE, u, w)
    })
    .unwrap();
    let mut mlp = Mlp::new(SHAPE, None, vec![], vec![]);
    let mut trace = Trace::default();
    for (step, &lr) in LRS.iter().enumerate() {
        for micro in 0..ACCUM {
            let (x, y) = micro_batch(&SHAPE, step, micro, rank);
            mlp.set_batch(x, y);
            e.micro_step(&train, &mut mlp).unwrap();
        }
        let report = e.step(lr).unwrap();
        trace.norms.push(report.grad_norm);
        trace.clips.push(report.clip_coef);
        trace.params.push(
            (0..SHAPE.blocks + 2)
                .map(|u| e.read_params(u).unwrap())
                .collect(),
        );
    }
    trace
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn every_stage_agrees_with_the_whole_buffer_reference_to_the_bit_at_one_to_four_ranks() {
    let mut clips = vec![];
    for world in 1..=4 {
        let want = reference(world);
        clips.extend(want.clips.iter().copied());
        for stage in ZeroStage::ALL {
            let comms = zero_comm::local::create(world).unwrap();
            let traces: Vec<Trace> = std::thread::scope(|s| {
                let hs: Vec<_> = comms
                    .into_iter()
                    .map(|c| s.spawn(move || engine_rank(c, stage)))
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            for (rank, got) in traces.iter().enumerate() {
                let at = format!("{stage} N={world} rank {rank}");
                assert_eq!(bits(&got.norms), bits(&want.norms), "{at}: norms");
                assert_eq!(
                    bits(&got.clips),
                    bits(&want.clips),
                    "{at}: clip coefficients"
                );
                for (step, (g, w)) in got.params.iter().zip(&want.params).enumerate() {
                    for (u, (gu, wu)) in g.iter().zip(w).enumerate() {
                        assert_eq!(bits(gu), bits(wu), "{at}: step {step} unit {u}");
                    }
                }
            }
        }
    }
    // Some steps clip and some do not, so both branches of the clip were compared.
    assert!(
        clips.iter().any(|&c| c < 1.0) && clips.contains(&1.0),
        "{clips:?}"
    );
}
