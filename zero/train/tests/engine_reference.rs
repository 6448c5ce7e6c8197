//! The ZeRO engine at every stage against an independent reference that shares none of its
//! bucketing, reduction, accumulation, norm or optimizer code.
//!
//! The reference runs zero-gpt's whole-buffer `Gpt::forward_backward` on each rank's
//! micro-batch, then writes out, element by element, the arithmetic the engine promises:
//! - the local backend's average: the ranks' f32 gradients summed in rank order 0..N-1 in
//!   f32, divided (not multiplied by 1/N) by N;
//! - accumulation over micro-steps: `acc = acc + avg` in f32, from zero;
//! - the tied embedding's gradient comes in two parts per micro-step, each averaged as
//!   above on its own: the LM head's d(wte) (reduced when the head's backward ends) and the
//!   encoder's d(wte), d(wpe) (reduced at the end of backward); they are added to the
//!   accumulator one after the other, `acc = (acc + avg_head) + avg_encoder`, never summed
//!   first (f32 addition is not associative, so the two orders differ in the last bits);
//! - the mean over micro-steps and the clip folded into the gradient: `(g * (1/k)) * clip`;
//! - the global norm: per rank, the squares (in f64) of that rank's shard of every unit, units
//!   in order, summed in f64; each partial carried as an (f32 hi, f32 lo) pair, as the engine
//!   exchanges it; partials added in rank order; square root;
//! - clip coefficient `min(max_norm / (norm + 1e-6), 1)`, torch's formula;
//! - AdamW as torch computes it, bias corrections in f64 rounded to f32.
//!
//! Engine and reference must agree to the bit at N_d = 1..4, every stage, over three steps of
//! two micro-steps. The norm's summation order depends on the shard boundaries, so the
//! reference cuts units into shards itself from the documented rule (pad to a multiple of
//! `N_d * SHARD_ALIGN_ELEMS`, equal shards).

use zero::{Engine, EngineConfig, ZeroStage, SHARD_ALIGN_ELEMS};
use zero_gpt::{init_params, init_unit, Gpt, GptConfig, ParamLayout, Rng};
use zero_train::bridge::{full_params, gpt_engine, micro_step};

/// T: tokens per sequence.
const T: usize = 8;
/// Micro-steps per optimizer step.
const ACCUM: usize = 2;
/// Learning rate of each optimizer step (varied so Adam's step size differs per step).
const LRS: [f32; 3] = [1e-2, 3e-2, 2e-2];
const SEED: u64 = 7;
/// Between the steps' gradient norms, so some steps clip and some do not (checked below).
const GRAD_CLIP: f32 = 1.2;

/// L=2, NH=2, C=32, T=8, V=64 (padded to 128).
fn config() -> GptConfig {
    GptConfig::new(T, 64, 2, 2, 32).unwrap()
}

/// Rank `rank`'s (tokens, targets) for micro-step `micro` of step `step`: one sequence.
fn micro_batch(step: usize, micro: usize, rank: usize) -> (Vec<u32>, Vec<u32>) {
    let mut rng = Rng::new(((step * 16 + micro) * 16 + rank) as u64 + 99);
    let vocab = config().vocab_size as u64;
    let seq: Vec<u32> = (0..=T).map(|_| (rng.next_u64() % vocab) as u32).collect();
    (seq[..T].to_vec(), seq[1..].to_vec())
}

/// What a run did, as rank 0 saw it (and every rank agreed on).
#[derive(Debug, Default, PartialEq)]
struct Trace {
    /// Per step, per micro-step, per rank: the rank's mean loss.
    losses: Vec<Vec<Vec<f32>>>,
    grad_norms: Vec<f32>,
    clip_coefs: Vec<f32>,
    /// Per step, every unit's whole parameters after the update.
    params: Vec<Vec<Vec<f32>>>,
}

// ---------------------------------------------------------------- the reference

/// Rank `r`'s real elements of a unit of `numel` elements split over `world` ranks.
fn data_shard(numel: usize, world: usize, r: usize) -> std::ops::Range<usize> {
    let quantum = world * SHARD_ALIGN_ELEMS;
    let shard_len = numel.div_ceil(quantum) * quantum / world;
    (r * shard_len).min(numel)..((r + 1) * shard_len).min(numel)
}

/// One rank's gradients, unit by unit, with the embedding's two parts apart: entry 0 holds
/// the LM head's part of d(embedding), the last entry (one past the units) the encoder's.
fn rank_grads(model: &Gpt, params: &[Vec<f32>], x: &[u32], y: &[u32]) -> (f32, Vec<Vec<f32>>) {
    let mut acts = model.activations(1, T).unwrap();
    let mut grads: Vec<Vec<f32>> = params.iter().map(|p| vec![0.0; p.len()]).collect();
    let mut encoder = vec![0.0; params[0].len()];
    let loss = model
        .forward(&mut acts, params, x, Some(y))
        .unwrap()
        .unwrap();
    let last = model.layout().final_norm_unit();
    let (embed, rest) = grads.split_at_mut(1);
    model
        .head_backward(
            &mut acts,
            &params[last],
            &params[0],
            &mut rest[last - 1],
            &mut embed[0],
        )
        .unwrap();
    for layer in (0..model.config().num_layers).rev() {
        let unit = ParamLayout::block_unit(layer);
        model
            .block_backward(&mut acts, layer, &params[unit], &mut rest[unit - 1])
            .unwrap();
    }
    model.embed_backward(&mut acts, &mut encoder).unwrap();
    grads.push(encoder);
    (loss, grads)
}

/// Every rank's gradients of micro-step `micro` ([`rank_grads`]'s entries), averaged as the
/// local backend averages: summed in rank order in f32, then divided by N.
fn averaged_grads(
    model: &Gpt,
    params: &[Vec<f32>],
    world: usize,
    step: usize,
    micro: usize,
    losses: &mut Vec<f32>,
) -> Vec<Vec<f32>> {
    let per_rank: Vec<Vec<Vec<f32>>> = (0..world)
        .map(|rank| {
            let (x, y) = micro_batch(step, micro, rank);
            let (loss, grads) = rank_grads(model, params, &x, &y);
            losses.push(loss);
            grads
        })
        .collect();
    let mut avg: Vec<Vec<f32>> = per_rank[0].iter().map(|p| vec![0.0; p.len()]).collect();
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
        // Carried between ranks as two f32: the high part and the remainder.
        let hi = partial as f32;
        let lo = (partial - f64::from(hi)) as f32;
        total += f64::from(hi) + f64::from(lo);
    }
    total.sqrt()
}

/// Which elements of each unit take weight decay, from the model's own tensor table.
fn decay_masks(layout: &ParamLayout) -> Vec<Vec<bool>> {
    layout
        .units()
        .iter()
        .map(|unit| {
            let mut mask = vec![false; unit.len];
            for t in unit.tensors.iter().filter(|t| t.weight_decay) {
                mask[t.offset..t.offset + t.len].fill(true);
            }
            mask
        })
        .collect()
}

/// Adam's moments of every unit.
struct Moments {
    m: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

/// torch.optim.AdamW, element by element, on every unit; `t` counts from 1.
fn adamw(
    params: &mut [Vec<f32>],
    grads: &[Vec<f32>],
    moments: &mut Moments,
    decays: &[Vec<bool>],
    t: i32,
    lr: f32,
) {
    let opt = EngineConfig::default().adam;
    let (b1, b2, eps, wd) = (opt.beta1, opt.beta2, opt.eps, opt.weight_decay);
    let step_size = (f64::from(lr) / (1.0 - f64::from(b1).powi(t))) as f32;
    let inv_sqrt_bc2 = (1.0 / (1.0 - f64::from(b2).powi(t)).sqrt()) as f32;
    let decay_factor = 1.0 - lr * wd;
    for u in 0..params.len() {
        for i in 0..params[u].len() {
            let g = grads[u][i];
            let m = b1 * moments.m[u][i] + (1.0 - b1) * g;
            let v = b2 * moments.v[u][i] + (1.0 - b2) * g * g;
            moments.m[u][i] = m;
            moments.v[u][i] = v;
            let denom = v.sqrt() * inv_sqrt_bc2 + eps;
            let decay = if decays[u][i] { decay_factor } else { 1.0 };
            params[u][i] = params[u][i] * decay - step_size * (m / denom);
        }
    }
}

/// The reference training run at `world` ranks.
fn reference(world: usize) -> Trace {
    let config = config();
    let model = Gpt::new(config).unwrap();
    let layout = model.layout().clone();
    let decays = decay_masks(&layout);
    let mut params = init_params(&config, &layout, SEED);
    let lens: Vec<usize> = params.iter().map(Vec::len).collect();
    let zeros = || -> Vec<Vec<f32>> { lens.iter().map(|&n| vec![0.0; n]).collect() };
    let mut moments = Moments {
        m: zeros(),
        v: zeros(),
    };
    let mut trace = Trace::default();
    for (step, &lr) in LRS.iter().enumerate() {
        let mut acc = zeros();
        let mut step_losses = vec![];
        for micro in 0..ACCUM {
            let mut losses = vec![];
            let mut avg = averaged_grads(&model, &params, world, step, micro, &mut losses);
            // The embedding's head part is in avg[0]; its encoder part, added second, last.
            let encoder = avg.pop().unwrap();
            for (a, g) in acc.iter_mut().flatten().zip(avg.iter().flatten()) {
                *a += *g;
            }
            for (a, g) in acc[0].iter_mut().zip(&encoder) {
                *a += *g;
            }
            step_losses.push(losses);
        }
        let factor = 1.0 / ACCUM as f32;
        let norm = global_norm(&acc, factor, world);
        let clip = (f64::from(GRAD_CLIP) / (norm + 1e-6)).min(1.0) as f32;
        for g in acc.iter_mut().flatten() {
            *g = *g * factor * clip;
        }
        adamw(
            &mut params,
            &acc,
            &mut moments,
            &decays,
            step as i32 + 1,
            lr,
        );
        trace.losses.push(step_losses);
        trace.grad_norms.push(norm as f32);
        trace.clip_coefs.push(clip);
        trace.params.push(params.clone());
    }
    trace
}

// ---------------------------------------------------------------- the engine

/// One rank's view of an engine run: its own losses, and what every rank shares.
fn engine_rank(engine: &mut Engine, model: &Gpt) -> (Vec<Vec<f32>>, Trace) {
    let rank = engine.rank();
    let mut acts = model.activations(1, T).unwrap();
    let mut mine = vec![];
    let mut trace = Trace::default();
    for (step, &lr) in LRS.iter().enumerate() {
        let losses: Vec<f32> = (0..ACCUM)
            .map(|micro| {
                let (x, y) = micro_batch(step, micro, rank);
                micro_step(engine, model, &mut acts, &x, &y).unwrap()
            })
            .collect();
        mine.push(losses);
        let report = engine.step(lr).unwrap();
        trace.grad_norms.push(report.grad_norm);
        trace.clip_coefs.push(report.clip_coef);
        trace.params.push(full_params(engine).unwrap());
    }
    (mine, trace)
}

fn engine_run(world: usize, stage: ZeroStage) -> Trace {
    let config = config();
    let engine_config = EngineConfig {
        stage,
        grad_clip: GRAD_CLIP,
        ..EngineConfig::default()
    };
    let comms = zero_comm::local::create(world).unwrap();
    let ranks: Vec<(Vec<Vec<f32>>, Trace)> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|comm| {
                s.spawn(move || {
                    let model = Gpt::new(config).unwrap();
                    let layout = model.layout().clone();
                    let mut engine = gpt_engine(comm, &layout, None, engine_config, |unit, w| {
                        init_unit(&config, &layout, unit, SEED, w).unwrap()
                    })
                    .unwrap();
                    engine_rank(&mut engine, &model)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut shared = ranks.iter().map(|(_, t)| t);
    let first = shared.next().unwrap();
    for (r, t) in shared.enumerate() {
        assert!(
            bits_eq(t, first),
            "{stage} N={world}: rank {} disagrees",
            r + 1
        );
    }
    let losses = (0..LRS.len())
        .map(|step| {
            (0..ACCUM)
                .map(|micro| ranks.iter().map(|(l, _)| l[step][micro]).collect())
                .collect()
        })
        .collect();
    Trace {
        losses,
        grad_norms: first.grad_norms.clone(),
        clip_coefs: first.clip_coefs.clone(),
        params: first.params.clone(),
    }
}

// ---------------------------------------------------------------- comparisons

fn bits<'a>(xs: impl IntoIterator<Item = &'a f32>) -> Vec<u32> {
    xs.into_iter().map(|x| x.to_bits()).collect()
}

/// Shared parts (norms, clip coefficients, parameters) equal to the bit.
fn bits_eq(a: &Trace, b: &Trace) -> bool {
    bits(&a.grad_norms) == bits(&b.grad_norms)
        && bits(&a.clip_coefs) == bits(&b.clip_coefs)
        && bits(a.params.iter().flatten().flatten()) == bits(b.params.iter().flatten().flatten())
}

fn assert_matches_reference(stage: ZeroStage) {
    for world in 1..=4 {
        let want = reference(world);
        let got = engine_run(world, stage);
        let what = format!("{stage} at N={world}");
        let flat = |t: &Trace| bits(t.losses.iter().flatten().flatten());
        assert_eq!(flat(&got), flat(&want), "{what}: losses");
        assert_eq!(
            bits(&got.grad_norms),
            bits(&want.grad_norms),
            "{what}: grad norms {:?} vs reference {:?}",
            got.grad_norms,
            want.grad_norms
        );
        assert_eq!(
            bits(&got.clip_coefs),
            bits(&want.clip_coefs),
            "{what}: clip"
        );
        for (step, (g, w)) in got.params.iter().zip(&want.params).enumerate() {
            for (unit, (g, w)) in g.iter().zip(w).enumerate() {
                let differ = g.iter().zip(w).filter(|(a, b)| a.to_bits() != b.to_bits());
                assert_eq!(
                    differ.count(),
                    0,
                    "{what}: step {step} unit {unit}: parameters differ from the reference"
                );
            }
        }
    }
}

#[test]
fn stage_0_matches_the_reference() {
    assert_matches_reference(ZeroStage::Zero0);
}

#[test]
fn stage_1_matches_the_reference() {
    assert_matches_reference(ZeroStage::Zero1);
}

#[test]
fn stage_2_matches_the_reference() {
    assert_matches_reference(ZeroStage::Zero2);
}

#[test]
fn stage_3_matches_the_reference() {
    assert_matches_reference(ZeroStage::Zero3);
}

/// The bitwise comparison above means something only if the reference exercises what it
/// claims: parameters move, clipping is on for some steps and off for others, and the reduction order of these
/// gradients shows in the bits (so an engine summing in another order would fail).
#[test]
fn the_reference_is_sensitive_to_what_it_checks() {
    let run = reference(4);
    let clipped = run.clip_coefs.iter().filter(|&&c| c < 1.0).count();
    assert!(
        0 < clipped && clipped < LRS.len(),
        "want clipped and unclipped steps; norms {:?}",
        run.grad_norms
    );
    assert_ne!(bits(run.params[0].iter().flatten()), {
        let config = config();
        let layout = ParamLayout::new(&config);
        bits(init_params(&config, &layout, SEED).iter().flatten())
    });
    // Rank order vs reversed rank order, on the first micro-step's gradients.
    let model = Gpt::new(config()).unwrap();
    let params = init_params(&config(), model.layout(), SEED);
    let mut acts = model.activations(1, T).unwrap();
    let per_rank: Vec<Vec<f32>> = (0..4)
        .map(|rank| {
            let mut grads: Vec<Vec<f32>> = params.iter().map(|p| vec![0.0; p.len()]).collect();
            let (x, y) = micro_batch(0, 0, rank);
            model
                .forward_backward(&mut acts, &params, &mut grads, &x, &y)
                .unwrap();
            grads.concat()
        })
        .collect();
    let order_shows = (0..per_rank[0].len()).any(|i| {
        let forward = ((per_rank[0][i] + per_rank[1][i]) + per_rank[2][i]) + per_rank[3][i];
        let backward = ((per_rank[3][i] + per_rank[2][i]) + per_rank[1][i]) + per_rank[0][i];
        forward.to_bits() != backward.to_bits()
    });
    assert!(
        order_shows,
        "these gradients sum to the same bits in any order"
    );
}
