//! The group run in lockstep and its references: configs and batches, the whole model's
//! step, a group's ranks, the naive all-reduce, the split step, and the index arithmetic
//! that puts rank slices back into whole tensors.

pub use std::collections::HashMap;
pub use std::ops::Range;
pub use std::sync::{Barrier, Mutex};
pub use std::thread;

pub use proptest::prelude::*;

pub use zero_gpt::{
    init_params, init_split_unit, slice_part, tp_train_ops, Activations, BlockPart, Buffer,
    CpuBackend, Gpt, GptConfig, GptError, GptOp, KeptBy, ParamLayout, Rng, TpOp, TpSplit, UnitKind,
    KEPT_INPUTS,
};

pub const B: usize = 2;
pub const S: usize = 8;
pub const SEED: u64 = 1234;
/// The largest relative difference allowed between a gradient at T > 1 and at T = 1.
pub const GRAD_TOL: f64 = 1e-5;
/// The largest relative difference allowed between the losses.
pub const LOSS_TOL: f64 = 1e-6;

/// L = 2, NH = 4, C = 32, maxS = 16, V = 50 (padded to 128).
pub fn config() -> GptConfig {
    GptConfig::new(16, 50, 2, 4, 32).unwrap()
}

/// Deterministic tokens and targets (B, S), every id below V.
pub fn batch(cfg: &GptConfig) -> (Vec<u32>, Vec<u32>) {
    micro_batch(cfg, 0)
}

/// Micro-batch `step` of a sequence of them: tokens and targets (B, S) below V.
pub fn micro_batch(cfg: &GptConfig, step: u32) -> (Vec<u32>, Vec<u32>) {
    let v = cfg.vocab_size as u32;
    let ids = |a: u32, b: u32| {
        (0..(B * S) as u32)
            .map(|i| (i * a + b + 13 * step) % v)
            .collect()
    };
    (ids(7, 3), ids(11, 5))
}

pub fn zeros(layout: &ParamLayout) -> Vec<Vec<f32>> {
    layout.unit_lens().iter().map(|&n| vec![0.0; n]).collect()
}

/// The whole model's parameters: the seeded init, or (`perturbed`) every element scaled by
/// 3 and moved by up to ±0.1, so that the biases and LayerNorm parameters are not their
/// init's 0 and 1 (a row-parallel bias added by every rank, or by none, would show) and the
/// attention is far from uniform.
pub fn whole_params(cfg: &GptConfig, perturbed: bool) -> Vec<Vec<f32>> {
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
pub fn whole_step(cfg: &GptConfig, params: &[Vec<f32>], steps: u32) -> (f32, Vec<Vec<f32>>) {
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
pub struct Rank {
    pub model: Gpt,
    pub params: Vec<Vec<f32>>,
    pub grads: Vec<Vec<f32>>,
    pub acts: Activations,
}

/// Rank `split.rank` (its vocabulary split too with `vocab`), its units made by
/// `unit(layout, index, buffer)`.
pub fn rank(
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
pub fn ranks(cfg: &GptConfig, t: usize) -> Vec<Rank> {
    init_ranks(cfg, t, false)
}

/// A group of `t` ranks (the vocabulary split too with `vocab`) initialised by
/// [`init_split_unit`] from [`SEED`].
pub fn init_ranks(cfg: &GptConfig, t: usize, vocab: bool) -> Vec<Rank> {
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
pub fn ranks_from(cfg: &GptConfig, t: usize, whole: &[Vec<f32>], vocab: bool) -> Vec<Rank> {
    let whole_layout = ParamLayout::new(cfg);
    let cut = |split| {
        let whole_layout = &whole_layout;
        move |layout: &ParamLayout, unit: usize, out: &mut [f32]| {
            let part = &layout.units()[unit];
            match part.kind {
                UnitKind::AttentionSlice { layer }
                | UnitKind::MlpSlice { layer }
                | UnitKind::BlockReplicated { layer } => {
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
pub fn all_reduce(ranks: &mut [Rank]) {
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
pub fn no_reduce(ranks: &mut [Rank]) {
    for r in ranks {
        r.model.tp_partial(&mut r.acts).unwrap();
    }
}

pub fn each(ranks: &mut [Rank], mut call: impl FnMut(&mut Rank) -> Result<(), GptError>) {
    for r in ranks {
        call(r).unwrap();
    }
}

/// Block `layer`'s gradient units of one rank: (attention slice, MLP slice, replicated).
pub fn block_grads(grads: &mut [Vec<f32>], layer: usize) -> [&mut [f32]; 3] {
    let first = ParamLayout::attention_slice_unit(layer);
    let [a, m, r] = &mut grads[first..first + 3] else {
        unreachable!("three consecutive units per split block")
    };
    [a, m, r]
}

/// Block `layer`'s parameter units of one rank: (attention slice, MLP slice, replicated).
pub fn block_params(params: &[Vec<f32>], layer: usize) -> [&[f32]; 3] {
    ParamLayout::split_block_units(layer).map(|u| &params[u][..])
}

/// Forward of the split blocks `layers` on every rank, in lockstep, `reduce` between the
/// calls (in backward, their recompute).
pub fn tp_blocks_forward(ranks: &mut [Rank], layers: Range<usize>, reduce: fn(&mut [Rank])) {
    for layer in layers {
        let [au, mu, ru] = ParamLayout::split_block_units(layer);
        each(ranks, |r| {
            r.model
                .tp_attention_forward(&mut r.acts, layer, &r.params[au], &r.params[ru])
        });
        reduce(ranks);
        each(ranks, |r| {
            r.model
                .tp_mlp_forward(&mut r.acts, layer, &r.params[mu], &r.params[ru])
        });
        reduce(ranks);
        each(ranks, |r| r.model.tp_block_output(&mut r.acts, layer));
    }
}

/// Backward of the split blocks on every rank, in lockstep, `reduce` between the calls.
pub fn tp_backward(ranks: &mut [Rank], layers: usize, reduce: fn(&mut [Rank])) {
    tp_backward_with(ranks, layers, reduce, &mut |_, _| {});
}

/// [`tp_backward`], calling `before_recompute(ranks, first block)` before each segment's
/// recompute.
pub fn tp_backward_with(
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
        let [au, mu, ru] = ParamLayout::split_block_units(layer);
        each(ranks, |r| {
            let [_, mg, rg] = block_grads(&mut r.grads, layer);
            let params = [&r.params[mu][..], &r.params[ru][..]];
            r.model.tp_mlp_backward(&mut r.acts, layer, params, mg, rg)
        });
        reduce(ranks);
        each(ranks, |r| {
            let [ag, _, rg] = block_grads(&mut r.grads, layer);
            let params = [&r.params[au][..], &r.params[ru][..]];
            r.model
                .tp_attention_backward(&mut r.acts, layer, params, ag, rg)
        });
        reduce(ranks);
        each(ranks, |r| {
            let [_, _, rg] = block_grads(&mut r.grads, layer);
            r.model
                .tp_block_input_grad(&mut r.acts, layer, &r.params[ru], rg)
        });
    }
}

/// One training step of the group; returns every rank's loss.
pub fn tp_step(ranks: &mut [Rank], cfg: &GptConfig, reduce: fn(&mut [Rank])) -> Vec<f32> {
    tp_micro_step(ranks, cfg, reduce, 0)
}

/// Micro-step `step` of the group (gradients accumulate); returns every rank's loss.
pub fn tp_micro_step(
    ranks: &mut [Rank],
    cfg: &GptConfig,
    reduce: fn(&mut [Rank]),
    step: u32,
) -> Vec<f32> {
    let (tokens, targets) = micro_batch(cfg, step);
    let layers = cfg.num_layers;
    let vocab = ranks[0].model.layout().vocab_parallel();
    let positions = ranks[0].model.layout().positions_unit().unwrap_or(0);
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
pub fn replicated_head(ranks: &mut [Rank], cfg: &GptConfig, targets: &[u32]) -> Vec<f32> {
    let last = ParamLayout::split(cfg, 2).final_norm_unit();
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
pub fn vocab_head(
    ranks: &mut [Rank],
    cfg: &GptConfig,
    targets: &[u32],
    reduce: fn(&mut [Rank]),
) -> Vec<f32> {
    let last = ParamLayout::split_vocab(cfg, 2).final_norm_unit();
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
pub fn gather(
    parts: &[&[f32]],
    rows: usize,
    cols: usize,
    groups: usize,
    cols_split: bool,
) -> Vec<f32> {
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
pub fn holds(part: &UnitKind, whole: &UnitKind) -> bool {
    match (part, whole) {
        (
            UnitKind::AttentionSlice { layer }
            | UnitKind::MlpSlice { layer }
            | UnitKind::BlockReplicated { layer },
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
pub fn whole_tensor(
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
    if !part.kind.is_slice() {
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
pub fn rel_diff(got: &[f32], want: &[f32]) -> f64 {
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
pub fn compare_grads(ranks: &[Rank], cfg: &GptConfig, whole: &[Vec<f32>]) -> Vec<(String, f64)> {
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
pub fn check_group(cfg: &GptConfig, t: usize, vocab: bool, perturbed: bool, steps: u32) -> f64 {
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
        // rel_diff: relative, or absolute where the whole loss is 0 (a one-token vocabulary).
        let rel = rel_diff(&[l], &[loss]);
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
