//! Megatron-style tensor parallelism of the blocks, on the CPU: T ranks of a split model
//! ([`Gpt::with_tensor_parallel`], or [`Gpt::with_vocab_parallel`] splitting the vocabulary
//! too) run in lockstep in one thread, the group's all-reduces done here by a naive sum of
//! the ranks' buffers (rank order, the sum written back to every rank), against the whole
//! model (T = 1) from the same parameters. The ranks' gradient slices are put back into
//! whole tensors by this file's own index arithmetic. The drivers that take the all-reduce
//! as a closure run with each rank on its own thread and must give the lockstep bits;
//! checkpointed split blocks must give the un-checkpointed bits.
//!
//! Legend: T the tensor-parallel size, B batch, S sequence, C channels, NH heads, L layers.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Barrier, Mutex};
use std::thread;

use proptest::prelude::*;

use zero_gpt::{
    init_params, init_split_unit, slice_part, tp_train_ops, Activations, BlockPart, Buffer,
    CpuBackend, Gpt, GptConfig, GptError, GptOp, KeptBy, ParamLayout, Rng, TpOp, TpSplit, UnitKind,
    KEPT_INPUTS,
};

const B: usize = 2;
const S: usize = 8;
const SEED: u64 = 1234;
/// The largest relative difference allowed between a gradient at T > 1 and at T = 1.
const GRAD_TOL: f64 = 1e-5;
/// The largest relative difference allowed between the losses.
const LOSS_TOL: f64 = 1e-6;

/// L = 2, NH = 4, C = 32, maxS = 16, V = 50 (padded to 128).
fn config() -> GptConfig {
    GptConfig::new(16, 50, 2, 4, 32).unwrap()
}

/// Deterministic tokens and targets (B, S), every id below V.
fn batch(cfg: &GptConfig) -> (Vec<u32>, Vec<u32>) {
    micro_batch(cfg, 0)
}

/// Micro-batch `step` of a sequence of them: tokens and targets (B, S) below V.
fn micro_batch(cfg: &GptConfig, step: u32) -> (Vec<u32>, Vec<u32>) {
    let v = cfg.vocab_size as u32;
    let ids = |a: u32, b: u32| {
        (0..(B * S) as u32)
            .map(|i| (i * a + b + 13 * step) % v)
            .collect()
    };
    (ids(7, 3), ids(11, 5))
}

fn zeros(layout: &ParamLayout) -> Vec<Vec<f32>> {
    layout.unit_lens().iter().map(|&n| vec![0.0; n]).collect()
}

/// The whole model's parameters: the seeded init, or (`perturbed`) every element scaled by
/// 3 and moved by up to ±0.1, so that the biases and LayerNorm parameters are not their
/// init's 0 and 1 (a row-parallel bias added by every rank, or by none, would show) and the
/// attention is far from uniform.
fn whole_params(cfg: &GptConfig, perturbed: bool) -> Vec<Vec<f32>> {
    let mut params = init_params(cfg, &ParamLayout::new(cfg), SEED);
    if perturbed {
        let mut rng = Rng::new(99);
        for x in params.iter_mut().flatten() {
            *x = *x * 3.0 + (0.2 * rng.uniform() - 0.1) as f32;
        }
    }
    params
}

/// `steps` micro-steps of the whole model from `params`: the last loss and the gradients
/// accumulated over the steps, one buffer per unit.
fn whole_step(cfg: &GptConfig, params: &[Vec<f32>], steps: u32) -> (f32, Vec<Vec<f32>>) {
    let model = Gpt::new(*cfg).unwrap();
    let mut grads = zeros(model.layout());
    let mut acts = model.activations(B, S).unwrap();
    let mut loss = f32::NAN;
    for step in 0..steps {
        let (tokens, targets) = micro_batch(cfg, step);
        loss = model
            .forward_backward(&mut acts, params, &mut grads, &tokens, &targets)
            .unwrap();
    }
    (loss, grads)
}

/// One rank of the group: its model, its units (split layout), its gradients, activations.
struct Rank {
    model: Gpt,
    params: Vec<Vec<f32>>,
    grads: Vec<Vec<f32>>,
    acts: Activations,
}

/// Rank `split.rank` (its vocabulary split too with `vocab`), its units made by
/// `unit(layout, index, buffer)`.
fn rank(
    cfg: &GptConfig,
    split: TpSplit,
    vocab: bool,
    mut unit: impl FnMut(&ParamLayout, usize, &mut [f32]),
) -> Rank {
    let model = if vocab {
        Gpt::with_vocab_parallel(*cfg, split).unwrap()
    } else {
        Gpt::with_tensor_parallel(*cfg, CpuBackend, split).unwrap()
    };
    let layout = model.layout().clone();
    let params = (0..layout.num_units())
        .map(|index| {
            let mut buf = vec![0.0; layout.units()[index].len];
            unit(&layout, index, &mut buf);
            buf
        })
        .collect();
    let acts = model.activations(B, S).unwrap();
    Rank {
        model,
        params,
        grads: zeros(&layout),
        acts,
    }
}

/// A group of `t` ranks initialised by [`init_split_unit`] from [`SEED`].
fn ranks(cfg: &GptConfig, t: usize) -> Vec<Rank> {
    init_ranks(cfg, t, false)
}

/// A group of `t` ranks (the vocabulary split too with `vocab`) initialised by
/// [`init_split_unit`] from [`SEED`].
fn init_ranks(cfg: &GptConfig, t: usize, vocab: bool) -> Vec<Rank> {
    let init = |split| {
        move |layout: &ParamLayout, unit, out: &mut [f32]| {
            init_split_unit(cfg, layout, split, unit, SEED, out).unwrap();
        }
    };
    (0..t)
        .map(|r| {
            rank(
                cfg,
                TpSplit { size: t, rank: r },
                vocab,
                init(TpSplit { size: t, rank: r }),
            )
        })
        .collect()
}

/// A group of `t` ranks (the vocabulary split too with `vocab`) holding `whole` (the whole
/// model's units), sliced by [`slice_part`].
fn ranks_from(cfg: &GptConfig, t: usize, whole: &[Vec<f32>], vocab: bool) -> Vec<Rank> {
    let whole_layout = ParamLayout::new(cfg);
    let cut = |split| {
        let whole_layout = &whole_layout;
        move |layout: &ParamLayout, unit: usize, out: &mut [f32]| {
            let part = &layout.units()[unit];
            match part.kind {
                UnitKind::BlockSlice { layer } | UnitKind::BlockReplicated { layer } => {
                    let from = ParamLayout::block_unit(layer);
                    let spec = &whole_layout.units()[from];
                    slice_part(cfg, split, spec, &whole[from], part, out).unwrap();
                }
                UnitKind::EmbeddingSlice | UnitKind::Positions => {
                    let spec = &whole_layout.units()[0];
                    slice_part(cfg, split, spec, &whole[0], part, out).unwrap();
                }
                UnitKind::FinalNorm => out.copy_from_slice(&whole[cfg.num_layers + 1]),
                _ => out.copy_from_slice(&whole[0]),
            }
        }
    };
    (0..t)
        .map(|r| {
            rank(
                cfg,
                TpSplit { size: t, rank: r },
                vocab,
                cut(TpSplit { size: t, rank: r }),
            )
        })
        .collect()
}

/// The group's all-reduce (sum): every rank's due buffer summed in rank order, and the sum
/// written back to every rank, so every rank holds the same bits.
fn all_reduce(ranks: &mut [Rank]) {
    let mut bufs: Vec<&mut [f32]> = ranks
        .iter_mut()
        .map(|r| r.model.tp_partial(&mut r.acts).unwrap())
        .collect();
    let mut sum = vec![0.0f32; bufs[0].len()];
    for buf in &bufs {
        for (s, &x) in sum.iter_mut().zip(buf.iter()) {
            *s += x;
        }
    }
    for buf in &mut bufs {
        buf.copy_from_slice(&sum);
    }
}

/// A broken collective: the buffers are taken but left as they are (each rank keeps only
/// its own part), to show the comparison catches a missing reduction.
fn no_reduce(ranks: &mut [Rank]) {
    for r in ranks {
        r.model.tp_partial(&mut r.acts).unwrap();
    }
}

fn each(ranks: &mut [Rank], mut call: impl FnMut(&mut Rank) -> Result<(), GptError>) {
    for r in ranks {
        call(r).unwrap();
    }
}

/// Block `layer`'s gradient units of one rank: (slice, replicated).
fn block_grads(grads: &mut [Vec<f32>], layer: usize) -> (&mut [f32], &mut [f32]) {
    let (su, ru) = (
        ParamLayout::slice_unit(layer),
        ParamLayout::replicated_unit(layer),
    );
    let (before, after) = grads.split_at_mut(ru);
    (&mut before[su], &mut after[0])
}

/// Forward of the split blocks `layers` on every rank, in lockstep, `reduce` between the
/// calls (in backward, their recompute).
fn tp_blocks_forward(ranks: &mut [Rank], layers: Range<usize>, reduce: fn(&mut [Rank])) {
    for layer in layers {
        let (su, ru) = (
            ParamLayout::slice_unit(layer),
            ParamLayout::replicated_unit(layer),
        );
        each(ranks, |r| {
            r.model
                .tp_attention_forward(&mut r.acts, layer, &r.params[su], &r.params[ru])
        });
        reduce(ranks);
        each(ranks, |r| {
            r.model
                .tp_mlp_forward(&mut r.acts, layer, &r.params[su], &r.params[ru])
        });
        reduce(ranks);
        each(ranks, |r| r.model.tp_block_output(&mut r.acts, layer));
    }
}

/// Backward of the split blocks on every rank, in lockstep, `reduce` between the calls.
fn tp_backward(ranks: &mut [Rank], layers: usize, reduce: fn(&mut [Rank])) {
    tp_backward_with(ranks, layers, reduce, &mut |_, _| {});
}

/// [`tp_backward`], calling `before_recompute(ranks, first block)` before each segment's
/// recompute.
fn tp_backward_with(
    ranks: &mut [Rank],
    layers: usize,
    reduce: fn(&mut [Rank]),
    before_recompute: &mut dyn FnMut(&mut [Rank], usize),
) {
    for layer in (0..layers).rev() {
        if ranks[0].acts.needs_recompute(layer) {
            let segment = ranks[0].acts.segment(layer);
            before_recompute(ranks, segment.start);
            tp_blocks_forward(ranks, segment, reduce);
        }
        let (su, ru) = (
            ParamLayout::slice_unit(layer),
            ParamLayout::replicated_unit(layer),
        );
        each(ranks, |r| {
            let (sg, rg) = block_grads(&mut r.grads, layer);
            let params = [&r.params[su][..], &r.params[ru][..]];
            r.model.tp_mlp_backward(&mut r.acts, layer, params, sg, rg)
        });
        reduce(ranks);
        each(ranks, |r| {
            let (sg, rg) = block_grads(&mut r.grads, layer);
            let params = [&r.params[su][..], &r.params[ru][..]];
            r.model
                .tp_attention_backward(&mut r.acts, layer, params, sg, rg)
        });
        reduce(ranks);
        each(ranks, |r| {
            let (_, rg) = block_grads(&mut r.grads, layer);
            r.model
                .tp_block_input_grad(&mut r.acts, layer, &r.params[ru], rg)
        });
    }
}

/// One training step of the group; returns every rank's loss.
fn tp_step(ranks: &mut [Rank], cfg: &GptConfig, reduce: fn(&mut [Rank])) -> Vec<f32> {
    tp_micro_step(ranks, cfg, reduce, 0)
}

/// Micro-step `step` of the group (gradients accumulate); returns every rank's loss.
fn tp_micro_step(
    ranks: &mut [Rank],
    cfg: &GptConfig,
    reduce: fn(&mut [Rank]),
    step: u32,
) -> Vec<f32> {
    let (tokens, targets) = micro_batch(cfg, step);
    let layers = cfg.num_layers;
    let vocab = ranks[0].model.layout().vocab_parallel();
    let positions = 2 * layers + 1; // wpe's unit with the vocabulary split
    if vocab {
        each(ranks, |r| {
            let (wte, wpe) = (&r.params[0], &r.params[positions]);
            r.model.tp_embed_forward(&mut r.acts, wte, wpe, &tokens)
        });
        reduce(ranks);
    } else {
        each(ranks, |r| {
            r.model.embed_forward(&mut r.acts, &r.params[0], &tokens)
        });
    }
    tp_blocks_forward(ranks, 0..layers, reduce);
    let losses = if vocab {
        vocab_head(ranks, cfg, &targets, reduce)
    } else {
        replicated_head(ranks, cfg, &targets)
    };
    tp_backward(ranks, layers, reduce);
    each(ranks, |r| {
        let (wte_grad, rest) = r.grads.split_at_mut(1);
        if vocab {
            let wpe_grad = &mut rest[positions - 1];
            r.model
                .tp_embed_backward(&mut r.acts, &mut wte_grad[0], wpe_grad)
        } else {
            r.model.embed_backward(&mut r.acts, &mut wte_grad[0])
        }
    });
    losses
}

/// The head whole on every rank, forward and backward; returns every rank's loss.
fn replicated_head(ranks: &mut [Rank], cfg: &GptConfig, targets: &[u32]) -> Vec<f32> {
    let last = 2 * cfg.num_layers + 1;
    let mut losses = Vec::new();
    for r in ranks.iter_mut() {
        let (embed, final_norm) = (&r.params[0], &r.params[last]);
        let loss = r
            .model
            .head_forward(&mut r.acts, final_norm, embed, Some(targets))
            .unwrap();
        losses.push(loss.unwrap());
    }
    each(ranks, |r| {
        let (embed_grad, rest) = r.grads.split_at_mut(1);
        let (embed, final_norm) = (&r.params[0], &r.params[last]);
        let final_grad = &mut rest[last - 1];
        r.model.head_backward(
            &mut r.acts,
            final_norm,
            embed,
            final_grad,
            &mut embed_grad[0],
        )
    });
    losses
}

/// The head over the split vocabulary, forward and backward, `reduce` between the calls;
/// returns every rank's loss.
fn vocab_head(
    ranks: &mut [Rank],
    cfg: &GptConfig,
    targets: &[u32],
    reduce: fn(&mut [Rank]),
) -> Vec<f32> {
    let last = 2 * cfg.num_layers + 2;
    each(ranks, |r| {
        let (wte, final_norm) = (&r.params[0], &r.params[last]);
        r.model
            .tp_head_forward(&mut r.acts, final_norm, wte, targets)
    });
    reduce(ranks);
    let losses = ranks
        .iter_mut()
        .map(|r| r.model.tp_head_loss(&mut r.acts).unwrap())
        .collect();
    each(ranks, |r| {
        r.model.tp_head_backward_input(&mut r.acts, &r.params[0])
    });
    reduce(ranks);
    each(ranks, |r| {
        let (wte_grad, rest) = r.grads.split_at_mut(1);
        let final_grad = &mut rest[last - 1];
        r.model
            .tp_head_backward_rest(&mut r.acts, &r.params[last], final_grad, &mut wte_grad[0])
    });
    losses
}

/// Rank parts of a whole (rows, cols) matrix put back together: rank r's part of each
/// `groups` consecutive row groups (rows split, `cols_split` false) or of every row
/// (columns split). `parts[r]` is rank r's tensor.
fn gather(parts: &[&[f32]], rows: usize, cols: usize, groups: usize, cols_split: bool) -> Vec<f32> {
    let t = parts.len();
    let mut whole = vec![f32::NAN; rows * cols];
    for (r, part) in parts.iter().enumerate() {
        if cols_split {
            let w = cols / t;
            for row in 0..rows {
                for j in 0..w {
                    whole[row * cols + r * w + j] = part[row * w + j];
                }
            }
        } else {
            let (group, h) = (rows / groups, rows / groups / t);
            for g in 0..groups {
                for i in 0..h {
                    for j in 0..cols {
                        whole[(g * group + r * h + i) * cols + j] = part[(g * h + i) * cols + j];
                    }
                }
            }
        }
    }
    whole
}

/// Whether a rank's unit of kind `part` holds tensors of the whole model's unit `whole`.
fn holds(part: &UnitKind, whole: &UnitKind) -> bool {
    match (part, whole) {
        (
            UnitKind::BlockSlice { layer } | UnitKind::BlockReplicated { layer },
            UnitKind::Block { layer: l },
        ) => layer == l,
        (
            UnitKind::Embedding | UnitKind::EmbeddingSlice | UnitKind::Positions,
            UnitKind::Embedding,
        ) => true,
        (UnitKind::FinalNorm, UnitKind::FinalNorm) => true,
        _ => false,
    }
}

/// Tensor `name` of the whole model's unit `whole_kind`, whole, from every rank's gradient
/// units: sliced tensors gathered, replicated ones taken from `rank`.
fn whole_tensor(
    ranks: &[Rank],
    whole_kind: &UnitKind,
    name: &str,
    cfg: &GptConfig,
    rank: usize,
) -> Vec<f32> {
    let layout = ranks[0].model.layout();
    let (unit, part) = layout
        .units()
        .iter()
        .enumerate()
        .find(|(_, u)| holds(&u.kind, whole_kind) && u.tensor(name).is_some())
        .unwrap();
    let tensor = |r: &Rank| -> Vec<f32> {
        let spec = r.model.layout().units()[unit].tensor(name).unwrap();
        r.grads[unit][spec.offset..spec.offset + spec.len].to_vec()
    };
    if !matches!(
        part.kind,
        UnitKind::BlockSlice { .. } | UnitKind::EmbeddingSlice
    ) {
        return tensor(&ranks[rank]);
    }
    let parts: Vec<Vec<f32>> = ranks.iter().map(tensor).collect();
    let parts: Vec<&[f32]> = parts.iter().map(Vec::as_slice).collect();
    let c = cfg.channels;
    match name {
        "qkvw" => gather(&parts, 3 * c, c, 3, false),
        "qkvb" => gather(&parts, 3 * c, 1, 3, false),
        "fcw" => gather(&parts, 4 * c, c, 1, false),
        "fcb" => gather(&parts, 4 * c, 1, 1, false),
        "attprojw" => gather(&parts, c, c, 1, true),
        "fcprojw" => gather(&parts, c, 4 * c, 1, true),
        "wte" => gather(&parts, cfg.padded_vocab_size, c, 1, false),
        other => panic!("no slicing known for {other}"),
    }
}

/// max |got - want| / max |want|: the relative difference of a tensor (its absolute
/// difference when `want` is all zeros).
fn rel_diff(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().map(|&x| f64::from(x).abs()).fold(0.0, f64::max);
    let diff = got
        .iter()
        .zip(want)
        .map(|(&g, &w)| (f64::from(g) - f64::from(w)).abs())
        // A NaN (a hole the gathering left, or a broken kernel) counts as infinitely far.
        .map(|d| if d.is_nan() { f64::INFINITY } else { d })
        .fold(0.0, f64::max);
    if scale == 0.0 {
        diff
    } else {
        diff / scale
    }
}

/// Every gradient tensor of the group against the whole model's, as (name, relative
/// difference); replicated tensors are compared on every rank.
fn compare_grads(ranks: &[Rank], cfg: &GptConfig, whole: &[Vec<f32>]) -> Vec<(String, f64)> {
    let whole_layout = ParamLayout::new(cfg);
    let mut out = Vec::new();
    for rank in 0..ranks.len() {
        for (index, unit) in whole_layout.units().iter().enumerate() {
            for spec in &unit.tensors {
                let got = whole_tensor(ranks, &unit.kind, spec.name, cfg, rank);
                let want = &whole[index][spec.offset..][..spec.len];
                let name = format!("unit {index} {} rank {rank}", spec.name);
                out.push((name, rel_diff(&got, want)));
            }
        }
    }
    out
}

/// A group of `t` ranks against the whole model of `cfg`, both from [`whole_params`], over
/// `steps` micro-steps: the last losses within [`LOSS_TOL`], every accumulated gradient
/// within [`GRAD_TOL`]; returns the largest gradient difference seen.
fn check_group(cfg: &GptConfig, t: usize, vocab: bool, perturbed: bool, steps: u32) -> f64 {
    let params = whole_params(cfg, perturbed);
    let (loss, whole) = whole_step(cfg, &params, steps);
    let mut group = ranks_from(cfg, t, &params, vocab);
    let mut losses = Vec::new();
    for step in 0..steps {
        losses = tp_micro_step(&mut group, cfg, all_reduce, step);
    }
    let case = format!(
        "NH={} C={} V={} T={t}{}{} steps={steps}",
        cfg.num_heads,
        cfg.channels,
        cfg.vocab_size,
        if vocab { " vocab-parallel" } else { "" },
        if perturbed { " perturbed" } else { "" }
    );
    for (rank, &l) in losses.iter().enumerate() {
        let rel = (f64::from(l) - f64::from(loss)).abs() / f64::from(loss).abs();
        if rank == 0 {
            println!("{case}: loss {l} (whole {loss}), relative difference {rel:e}");
        }
        assert!(rel <= LOSS_TOL, "{case} rank {rank}: loss {l} vs {loss}");
        assert_eq!(
            l.to_bits(),
            losses[0].to_bits(),
            "ranks disagree on the loss"
        );
    }
    let diffs = compare_grads(&group, cfg, &whole);
    let (worst, max) = diffs
        .iter()
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .cloned()
        .unwrap();
    println!("{case}: max gradient relative difference {max:e} ({worst})");
    for (name, diff) in &diffs {
        assert!(*diff <= GRAD_TOL, "{case}: {name} differs by {diff:e}");
    }
    max
}

#[test]
fn two_ranks_match_the_whole_model() {
    check_group(&config(), 2, false, false, 1);
    check_group(&config(), 2, false, true, 1);
}

#[test]
fn four_ranks_match_the_whole_model() {
    check_group(&config(), 4, false, false, 1);
    check_group(&config(), 4, false, true, 1);
}

/// Another shape (L = 3, NH = 8, C = 64, V = 70), down to one head per rank, and gradients
/// accumulated over two micro-batches.
#[test]
fn other_shapes_and_accumulated_micro_batches_match() {
    let cfg = GptConfig::new(16, 70, 3, 8, 64).unwrap();
    for t in [2, 8] {
        check_group(&cfg, t, false, true, 2);
    }
    check_group(&config(), 2, false, true, 2);
}

#[test]
fn a_missing_reduction_is_caught() {
    let cfg = config();
    let params = whole_params(&cfg, true);
    let (_, whole) = whole_step(&cfg, &params, 1);
    let mut group = ranks_from(&cfg, 2, &params, false);
    tp_step(&mut group, &cfg, no_reduce);
    let max = compare_grads(&group, &cfg, &whole)
        .into_iter()
        .map(|(_, d)| d)
        .fold(0.0, f64::max);
    println!("without the reductions: max gradient relative difference {max:e}");
    assert!(
        max > 1e3 * GRAD_TOL,
        "a missing reduction went unseen ({max:e})"
    );
}

#[test]
fn replicated_gradients_are_the_same_on_every_rank() {
    let cfg = config();
    let mut group = ranks(&cfg, 2);
    tp_step(&mut group, &cfg, all_reduce);
    let last = 2 * cfg.num_layers + 1;
    let mut units = vec![0, last];
    units.extend((0..cfg.num_layers).map(ParamLayout::replicated_unit));
    for unit in units {
        let (a, b) = (&group[0].grads[unit], &group[1].grads[unit]);
        assert!(a.iter().any(|&x| x != 0.0), "unit {unit} got no gradient");
        let same = a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(same, "unit {unit}: rank 0 and rank 1 differ");
    }
    // The slices differ: each rank holds its own part.
    let slice = ParamLayout::slice_unit(0);
    assert_ne!(group[0].grads[slice], group[1].grads[slice]);
}

fn invalid_field(err: GptError) -> &'static str {
    match err {
        GptError::InvalidConfig { field, .. } => field,
        other => panic!("expected InvalidConfig, got {other}"),
    }
}

#[test]
fn a_size_that_does_not_divide_the_heads_is_refused() {
    let cfg = config(); // NH = 4
    let split = |size, rank| Gpt::with_tensor_parallel(cfg, CpuBackend, TpSplit { size, rank });
    let err = split(3, 0).unwrap_err();
    assert!(err.to_string().contains("num_heads"), "{err}");
    assert_eq!(invalid_field(err), "num_heads");
    assert_eq!(invalid_field(split(8, 0).unwrap_err()), "num_heads");
    assert_eq!(
        invalid_field(split(0, 0).unwrap_err()),
        "tensor_parallel_size"
    );
    assert_eq!(
        invalid_field(split(2, 2).unwrap_err()),
        "tensor_parallel_rank"
    );
    assert!(TpSplit { size: 4, rank: 3 }.validate(&cfg).is_ok());
}

#[test]
fn whole_and_split_calls_do_not_mix() {
    let cfg = config();
    let mut group = ranks(&cfg, 2);
    let (tokens, targets) = batch(&cfg);
    let r = &mut group[0];
    // A split model runs no whole block, so no whole-model step either.
    let mut grads = zeros(r.model.layout());
    let err = r
        .model
        .forward_backward(&mut r.acts, &r.params, &mut grads, &tokens, &targets)
        .unwrap_err();
    assert!(matches!(err, GptError::OutOfOrder { .. }), "{err}");
    // A whole model runs no split call, and refuses a split model's activations.
    let whole = Gpt::new(cfg).unwrap();
    let mut acts = whole.activations(B, S).unwrap();
    let params = init_params(&cfg, whole.layout(), SEED);
    whole.embed_forward(&mut acts, &params[0], &tokens).unwrap();
    let err = whole
        .tp_attention_forward(&mut acts, 0, &params[1], &params[1])
        .unwrap_err();
    assert!(err.to_string().contains("not split"), "{err}");
    let err = whole
        .embed_forward(&mut r.acts, &params[0], &tokens)
        .unwrap_err();
    assert!(matches!(err, GptError::BadBatch { .. }), "{err}");
}

#[test]
fn a_call_before_its_reduction_is_refused() {
    let cfg = config();
    let mut group = ranks(&cfg, 2);
    let (tokens, _) = batch(&cfg);
    let r = &mut group[0];
    let (su, ru) = (ParamLayout::slice_unit(0), ParamLayout::replicated_unit(0));
    r.model
        .embed_forward(&mut r.acts, &r.params[0], &tokens)
        .unwrap();
    assert!(r.model.tp_partial(&mut r.acts).is_err(), "nothing due yet");
    r.model
        .tp_attention_forward(&mut r.acts, 0, &r.params[su], &r.params[ru])
        .unwrap();
    let err = r
        .model
        .tp_mlp_forward(&mut r.acts, 0, &r.params[su], &r.params[ru])
        .unwrap_err();
    assert!(matches!(err, GptError::OutOfOrder { .. }), "{err}");
    assert_eq!(
        r.model.tp_partial(&mut r.acts).unwrap().len(),
        B * S * cfg.channels
    );
    assert!(r.model.tp_partial(&mut r.acts).is_err(), "handed out once");
    r.model
        .tp_mlp_forward(&mut r.acts, 0, &r.params[su], &r.params[ru])
        .unwrap();
    let err = r.model.tp_block_output(&mut r.acts, 0).unwrap_err();
    assert!(matches!(err, GptError::OutOfOrder { .. }), "{err}");
}

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

#[test]
fn the_split_init_is_the_whole_init_sliced() {
    let cfg = config();
    let whole = init_params(&cfg, &ParamLayout::new(&cfg), SEED);
    for (t, vocab) in [(2, false), (4, false), (2, true), (4, true)] {
        let mut group = init_ranks(&cfg, t, vocab);
        // Put the parameters where the gradients go, to reuse the gathering.
        for r in &mut group {
            r.grads = r.params.clone();
        }
        let diffs = compare_grads(&group, &cfg, &whole);
        assert!(
            diffs.iter().all(|(_, d)| *d == 0.0),
            "T={t} {vocab}: {diffs:?}"
        );
    }
    let vocab = ParamLayout::split_vocab(&cfg, 4);
    assert_eq!(vocab.num_units(), 2 * cfg.num_layers + 3);
    assert_eq!(vocab.num_layers(), cfg.num_layers);
    assert_eq!(vocab.positions_unit(), Some(2 * cfg.num_layers + 1));
    let wte = cfg.padded_vocab_size * cfg.channels;
    assert_eq!(4 * vocab.units()[0].len, wte);
    let layout = ParamLayout::split(&cfg, 2);
    assert_eq!(layout.num_layers(), cfg.num_layers);
    assert_eq!(layout.num_units(), 2 * cfg.num_layers + 2);
    let per_rank = layout.units()[1].len;
    let replicated = layout.units()[2].len;
    let whole_block = ParamLayout::new(&cfg).units()[1].len;
    assert_eq!(2 * per_rank + replicated, whole_block);
}

#[test]
fn a_rank_holds_a_t_th_of_the_head_and_mlp_activations() {
    let cfg = config();
    let whole = Gpt::new(cfg).unwrap().activations(B, S).unwrap().bytes();
    let split = ranks(&cfg, 2)[0].acts.bytes();
    let split4 = ranks(&cfg, 4)[0].acts.bytes();
    assert!(split4 < split && split < whole, "{split4} {split} {whole}");
}

/// The vocabulary split too (`Gpt::with_vocab_parallel`): V = 50 of Vp = 128, so at T = 2
/// rank 1 holds padding only, and at T = 4 ranks 2 and 3 do.
#[test]
fn vocab_parallel_ranks_match_the_whole_model() {
    for t in [2, 4] {
        check_group(&config(), t, true, false, 1);
        check_group(&config(), t, true, true, 1);
    }
}

/// Every rank holding real ids (V = 120 of 128, T = 4), another shape down to one head and
/// 16 ids per rank (NH = 8, C = 64, V = 70, T = 8), and two accumulated micro-batches.
#[test]
fn vocab_parallel_other_shapes_and_micro_batches_match() {
    let every_rank_real = GptConfig::new(16, 120, 2, 4, 32).unwrap();
    check_group(&every_rank_real, 4, true, true, 2);
    let other = GptConfig::new(16, 70, 3, 8, 64).unwrap();
    for t in [2, 8] {
        check_group(&other, t, true, true, 2);
    }
}

#[test]
fn vocab_parallel_missing_reductions_are_caught() {
    let cfg = GptConfig::new(16, 120, 2, 4, 32).unwrap();
    let params = whole_params(&cfg, true);
    let (loss, whole) = whole_step(&cfg, &params, 1);
    let mut group = ranks_from(&cfg, 2, &params, true);
    let losses = tp_step(&mut group, &cfg, no_reduce);
    let max = compare_grads(&group, &cfg, &whole)
        .into_iter()
        .map(|(_, d)| d)
        .fold(0.0, f64::max);
    println!("vocab-parallel without the reductions: loss {} vs {loss}, max gradient relative difference {max:e}", losses[0]);
    assert!(
        max > 1e3 * GRAD_TOL,
        "a missing reduction went unseen ({max:e})"
    );
    assert!(
        (losses[0] - loss).abs() > 1e-3,
        "a missing reduction left the loss"
    );
}

#[test]
fn vocab_parallel_replicated_gradients_are_the_same_on_every_rank() {
    let cfg = GptConfig::new(16, 120, 2, 4, 32).unwrap();
    let params = whole_params(&cfg, true);
    let mut group = ranks_from(&cfg, 2, &params, true);
    tp_step(&mut group, &cfg, all_reduce);
    let layers = cfg.num_layers;
    let mut units = vec![2 * layers + 1, 2 * layers + 2]; // wpe, final norm
    units.extend((0..layers).map(ParamLayout::replicated_unit));
    for unit in units {
        let (a, b) = (&group[0].grads[unit], &group[1].grads[unit]);
        assert!(a.iter().any(|&x| x != 0.0), "unit {unit} got no gradient");
        let same = a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(same, "unit {unit}: rank 0 and rank 1 differ");
    }
    assert_ne!(
        group[0].grads[0], group[1].grads[0],
        "wte rows are each rank's own"
    );
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

#[test]
fn vocab_parallel_refusals() {
    // NH = 3 allows T = 3 for the blocks, but 3 does not divide Vp = 128.
    let cfg = GptConfig::new(16, 50, 1, 3, 24).unwrap();
    let split = TpSplit { size: 3, rank: 0 };
    assert!(Gpt::with_tensor_parallel(cfg, CpuBackend, split).is_ok());
    let err = Gpt::with_vocab_parallel(cfg, split).unwrap_err();
    assert_eq!(invalid_field(err), "padded_vocab_size");
    // The whole embedding and head refuse a split vocabulary, and the split ones a whole
    // one.
    let cfg = config();
    let (tokens, _) = batch(&cfg);
    let mut vocab = ranks_from(&cfg, 2, &whole_params(&cfg, false), true);
    let r = &mut vocab[0];
    let err = r
        .model
        .embed_forward(&mut r.acts, &r.params[0], &tokens)
        .unwrap_err();
    assert!(err.to_string().contains("vocabulary is split"), "{err}");
    let mut blocks_only = ranks(&cfg, 2);
    let b = &mut blocks_only[0];
    let err = b
        .model
        .tp_embed_forward(&mut b.acts, &b.params[0], &b.params[0], &tokens)
        .unwrap_err();
    assert!(err.to_string().contains("not split"), "{err}");
    // Activations of the blocks-only split do not fit the vocabulary split.
    let err = r
        .model
        .tp_embed_forward(&mut b.acts, &r.params[0], &r.params[5], &tokens);
    assert!(matches!(err, Err(GptError::BadBatch { .. })), "{err:?}");
    // The loss needs its statistics summed first.
    r.model
        .tp_embed_forward(&mut r.acts, &r.params[0], &r.params[5], &tokens)
        .unwrap();
    assert!(r.model.tp_head_loss(&mut r.acts).is_err());
}

/// At T = 1 the tensor-parallel constructors give the whole model, to the bit.
#[test]
fn one_rank_is_the_whole_model() {
    let cfg = config();
    let params = whole_params(&cfg, true);
    let (loss, grads) = whole_step(&cfg, &params, 1);
    let whole = TpSplit::NONE;
    for model in [
        Gpt::with_tensor_parallel(cfg, CpuBackend, whole).unwrap(),
        Gpt::with_vocab_parallel(cfg, whole).unwrap(),
    ] {
        assert_eq!(model.layout(), &ParamLayout::new(&cfg));
        let mut got = zeros(model.layout());
        let mut acts = model.activations(B, S).unwrap();
        let (tokens, targets) = micro_batch(&cfg, 0);
        let l = model
            .forward_backward(&mut acts, &params, &mut got, &tokens, &targets)
            .unwrap();
        assert_eq!(l.to_bits(), loss.to_bits());
        assert_eq!(got, grads);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    /// Random shapes: NH = 2..8 heads of 2..8 channels, T = 2..NH (a power of two), L = 1..2,
    /// V = 1..300 (Vp = 128..384, so some ranks hold padding only), the vocabulary split or
    /// not; perturbed parameters, two micro-batches.
    #[test]
    fn random_shapes_match_the_whole_model(
        heads_log in 1u32..4,
        t_pick in 0u32..3,
        hs in prop::sample::select(vec![2usize, 4, 8]),
        layers in 1usize..3,
        vocab_size in 1usize..300,
        vocab in any::<bool>(),
    ) {
        let nh = 1usize << heads_log;
        let t = 1usize << (1 + t_pick % heads_log);
        let cfg = GptConfig::new(16, vocab_size, layers, nh, nh * hs).unwrap();
        let max = check_group(&cfg, t, vocab, true, 2);
        prop_assert!(max <= GRAD_TOL);
    }
}

/// Checkpointing every k blocks: the group's recompute (the three calls of each block of a
/// segment and their reductions, again, in backward) gives the un-checkpointed group's
/// losses and gradients to the bit, the vocabulary split or not.
#[test]
fn checkpointed_split_blocks_give_the_same_bits() {
    let cfg = GptConfig::new(16, 120, 3, 4, 32).unwrap();
    let params = whole_params(&cfg, true);
    for vocab in [false, true] {
        let mut plain = ranks_from(&cfg, 2, &params, vocab);
        let want = tp_step(&mut plain, &cfg, all_reduce);
        for every in [1, 2] {
            let mut group = ranks_from(&cfg, 2, &params, vocab);
            for r in &mut group {
                r.acts = r.model.activations_checkpointed(B, S, Some(every)).unwrap();
            }
            let got = tp_step(&mut group, &cfg, all_reduce);
            assert_eq!(got, want, "vocab {vocab} every {every}: losses");
            for (g, p) in group.iter().zip(&plain) {
                assert_eq!(g.grads, p.grads, "vocab {vocab} every {every}: gradients");
            }
        }
    }
}

/// A checkpointed block's backward before its recompute, and a recompute out of order, are
/// refused (one rank, the reductions skipped: the order is all that is checked).
#[test]
fn a_backward_before_its_recompute_is_refused() {
    let cfg = GptConfig::new(16, 120, 3, 4, 32).unwrap();
    let mut group = ranks_from(&cfg, 2, &whole_params(&cfg, false), false);
    group.truncate(1);
    let r = &mut group[0];
    r.acts = r.model.activations_checkpointed(B, S, Some(1)).unwrap();
    let (tokens, targets) = batch(&cfg);
    let mut reduce = |_: &mut [f32]| -> Result<(), GptError> { Ok(()) };
    r.model
        .embed_forward(&mut r.acts, &r.params[0], &tokens)
        .unwrap();
    for layer in 0..3 {
        let unit = |u: usize| &r.params[u][..];
        let block = [
            unit(ParamLayout::slice_unit(layer)),
            unit(ParamLayout::replicated_unit(layer)),
        ];
        r.model
            .tp_block_forward(&mut r.acts, layer, block, &mut reduce)
            .unwrap();
    }
    let last = 2 * cfg.num_layers + 1;
    let (embed_grad, rest) = r.grads.split_at_mut(1);
    r.model
        .head_forward(&mut r.acts, &r.params[last], &r.params[0], Some(&targets))
        .unwrap();
    r.model
        .head_backward(
            &mut r.acts,
            &r.params[last],
            &r.params[0],
            &mut rest[last - 1],
            &mut embed_grad[0],
        )
        .unwrap();
    // Block 2 ends the last segment, kept in place; block 1 needs its recompute first.
    let params = |l: usize| {
        [
            &r.params[ParamLayout::slice_unit(l)][..],
            &r.params[ParamLayout::replicated_unit(l)][..],
        ]
    };
    let (sg, rg) = block_grads(&mut r.grads, 2);
    r.model
        .tp_block_backward(&mut r.acts, 2, params(2), [sg, rg], &mut reduce)
        .unwrap();
    assert!(r.acts.needs_recompute(1));
    let (sg, rg) = block_grads(&mut r.grads, 1);
    let err = r
        .model
        .tp_mlp_backward(&mut r.acts, 1, params(1), sg, rg)
        .unwrap_err();
    assert!(err.to_string().contains("not recomputed"), "{err}");
    let err = r
        .model
        .tp_block_forward(&mut r.acts, 0, params(0), &mut reduce)
        .unwrap_err();
    assert!(matches!(err, GptError::OutOfOrder { .. }), "{err}");
    r.model
        .tp_block_forward(&mut r.acts, 1, params(1), &mut reduce)
        .unwrap();
    let (sg, rg) = block_grads(&mut r.grads, 1);
    r.model
        .tp_block_backward(&mut r.acts, 1, params(1), [sg, rg], &mut reduce)
        .unwrap();
}

/// Inputs kept by the caller (as the engine keeps them in its arena): each rank's
/// activations from [`Gpt::activations_with_memory`] (sized by [`Gpt::activation_buffers`]),
/// [`Gpt::keep_input`] after a segment's first block, [`Gpt::restore_input`] before its
/// recompute; the same bits as inputs kept by the activations.
#[test]
fn caller_kept_inputs_give_the_model_kept_bits() {
    let cfg = GptConfig::new(16, 120, 3, 4, 32).unwrap();
    let (layers, every) = (cfg.num_layers, Some(1));
    let params = whole_params(&cfg, true);
    let mut model_kept = ranks_from(&cfg, 2, &params, false);
    for r in &mut model_kept {
        r.acts = r.model.activations_checkpointed(B, S, every).unwrap();
    }
    let want = tp_step(&mut model_kept, &cfg, all_reduce);
    let mut group = ranks_from(&cfg, 2, &params, false);
    for r in &mut group {
        let sizes = r.model.activation_buffers(B, S, every).unwrap();
        let alloc = |index: usize, len: usize| {
            assert!(
                index != KEPT_INPUTS && len == sizes[index],
                "buffer {index}: {len}"
            );
            Ok::<_, GptError>(Box::new(vec![0f32; len]) as Buffer)
        };
        r.acts = r
            .model
            .activations_with_memory((B, S), every, alloc, KeptBy::Caller)
            .unwrap();
    }
    let mut stores: Vec<HashMap<usize, Vec<f32>>> = vec![HashMap::new(); 2];
    let (tokens, targets) = batch(&cfg);
    each(&mut group, |r| {
        r.model.embed_forward(&mut r.acts, &r.params[0], &tokens)
    });
    for layer in 0..layers {
        tp_blocks_forward(&mut group, layer..layer + 1, all_reduce);
        if let Some(segment) = GptOp::Block(layer).keeps(layers, every) {
            for (r, store) in group.iter_mut().zip(&mut stores) {
                let mut kept = vec![0.0; B * S * cfg.channels];
                r.model.keep_input(&r.acts, layer, &mut kept).unwrap();
                store.insert(segment, kept);
            }
        }
    }
    let losses = replicated_head(&mut group, &cfg, &targets);
    let mut restore = |ranks: &mut [Rank], first: usize| {
        let segment = GptOp::Recompute(first).restores(layers, every).unwrap();
        for (r, store) in ranks.iter_mut().zip(&stores) {
            r.model
                .restore_input(&mut r.acts, first, &store[&segment])
                .unwrap();
        }
    };
    tp_backward_with(&mut group, layers, all_reduce, &mut restore);
    each(&mut group, |r| {
        r.model.embed_backward(&mut r.acts, &mut r.grads[0])
    });
    assert_eq!(losses, want);
    for (g, m) in group.iter().zip(&model_kept) {
        assert_eq!(g.grads, m.grads);
    }
}

/// `grads`' units `units`, mutably, in that order (distinct units).
fn pick_mut<'a>(grads: &'a mut [Vec<f32>], units: &[usize]) -> Vec<&'a mut [f32]> {
    let mut found: Vec<(usize, &mut [f32])> = grads
        .iter_mut()
        .enumerate()
        .filter(|(i, _)| units.contains(i))
        .map(|(i, g)| (i, g.as_mut_slice()))
        .collect();
    units
        .iter()
        .map(|u| {
            let at = found.iter().position(|(i, _)| i == u).unwrap();
            found.swap_remove(at).1
        })
        .collect()
}

/// One model call of a [`TpOp`] on one rank, its units taken from the op's `reads` and
/// `writes` alone; returns the loss when the op gives one.
fn run_op(
    r: &mut Rank,
    op: TpOp,
    tokens: &[u32],
    targets: &[u32],
) -> Result<Option<f32>, GptError> {
    let layout = r.model.layout().clone();
    let reads = op.reads(&layout);
    let p: Vec<&[f32]> = reads.iter().map(|&u| &r.params[u][..]).collect();
    let mut g = pick_mut(&mut r.grads, &op.writes(&layout));
    let (m, acts) = (&r.model, &mut r.acts);
    match op {
        TpOp::Embed => m.embed_forward(acts, p[0], tokens)?,
        TpOp::EmbedSlice => m.tp_embed_forward(acts, p[0], p[1], tokens)?,
        TpOp::Block(l, part) | TpOp::Recompute(l, part) => match part {
            BlockPart::Attention => m.tp_attention_forward(acts, l, p[0], p[1])?,
            BlockPart::Mlp => m.tp_mlp_forward(acts, l, p[0], p[1])?,
            BlockPart::Output => m.tp_block_output(acts, l)?,
        },
        TpOp::Head => return m.head_forward(acts, p[0], p[1], Some(targets)),
        TpOp::HeadSlice => m.tp_head_forward(acts, p[0], p[1], targets)?,
        TpOp::HeadLoss => return m.tp_head_loss(acts).map(Some),
        TpOp::HeadBackward => {
            let [g0, g1] = [g.remove(0), g.remove(0)];
            m.head_backward(acts, p[0], p[1], g0, g1)?;
        }
        TpOp::HeadSliceBackwardInput => m.tp_head_backward_input(acts, p[0])?,
        TpOp::HeadSliceBackwardRest => {
            let [g0, g1] = [g.remove(0), g.remove(0)];
            m.tp_head_backward_rest(acts, p[0], g0, g1)?;
        }
        TpOp::MlpBackward(l) | TpOp::AttentionBackward(l) => {
            let [g0, g1] = [g.remove(0), g.remove(0)];
            if matches!(op, TpOp::MlpBackward(_)) {
                m.tp_mlp_backward(acts, l, [p[0], p[1]], g0, g1)?;
            } else {
                m.tp_attention_backward(acts, l, [p[0], p[1]], g0, g1)?;
            }
        }
        TpOp::BlockInputGrad(l) => m.tp_block_input_grad(acts, l, p[0], g.remove(0))?,
        TpOp::EmbedBackward => m.embed_backward(acts, g.remove(0))?,
        TpOp::EmbedSliceBackward => {
            let [g0, g1] = [g.remove(0), g.remove(0)];
            m.tp_embed_backward(acts, g0, g1)?;
        }
        TpOp::AllReduce => unreachable!("the group's op"),
    }
    Ok(None)
}

/// [`tp_train_ops`] run on every rank in lockstep ([`TpOp::AllReduce`] by [`all_reduce`]),
/// the kept inputs in each rank's own store (`keeps`, `restores`); returns the losses.
fn run_program(ranks: &mut [Rank], cfg: &GptConfig, every: Option<usize>, vocab: bool) -> Vec<f32> {
    let (tokens, targets) = batch(cfg);
    let layers = cfg.num_layers;
    let mut stores: Vec<HashMap<usize, Vec<f32>>> = vec![HashMap::new(); ranks.len()];
    let mut losses = vec![f32::NAN; ranks.len()];
    for op in tp_train_ops(layers, every, vocab) {
        if op == TpOp::AllReduce {
            all_reduce(ranks);
            continue;
        }
        for ((r, store), loss) in ranks.iter_mut().zip(&mut stores).zip(&mut losses) {
            if let (Some(k), TpOp::Recompute(l, _)) = (op.restores(layers, every), op) {
                r.model.restore_input(&mut r.acts, l, &store[&k]).unwrap();
            }
            if let Some(l) = run_op(r, op, &tokens, &targets).unwrap() {
                *loss = l;
            }
            if let (Some(k), TpOp::Block(l, _)) = (op.keeps(layers, every), op) {
                let mut kept = vec![0.0; B * S * cfg.channels];
                r.model.keep_input(&r.acts, l, &mut kept).unwrap();
                store.insert(k, kept);
            }
        }
    }
    losses
}

/// The program ([`tp_train_ops`], units by `reads` and `writes`, inputs kept by the caller
/// per `keeps` and `restores`) gives the bits of the hand-written lockstep step, with the
/// vocabulary split or not, checkpointing or not.
#[test]
fn the_split_program_runs_the_step() {
    let cfg = GptConfig::new(16, 120, 3, 4, 32).unwrap();
    let params = whole_params(&cfg, true);
    for vocab in [false, true] {
        let mut plain = ranks_from(&cfg, 2, &params, vocab);
        let want = tp_step(&mut plain, &cfg, all_reduce);
        for every in [None, Some(1), Some(2)] {
            let mut group = ranks_from(&cfg, 2, &params, vocab);
            for r in &mut group {
                let alloc = |_, len| Ok::<_, GptError>(Box::new(vec![0f32; len]) as Buffer);
                let acts = r
                    .model
                    .activations_with_memory((B, S), every, alloc, KeptBy::Caller);
                r.acts = acts.unwrap();
            }
            let got = run_program(&mut group, &cfg, every, vocab);
            assert_eq!(got, want, "vocab {vocab} every {every:?}: losses");
            for (g, p) in group.iter().zip(&plain) {
                assert_eq!(g.grads, p.grads, "vocab {vocab} every {every:?}: gradients");
            }
        }
    }
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
