//! The split micro-step as data ([`tp_train_ops`]) run op by op: the hand-written step's bits.

use super::common::*;

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
