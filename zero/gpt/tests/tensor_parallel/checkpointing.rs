//! Checkpointed split blocks: recomputed in backward, kept by the model or by the caller,
//! the un-checkpointed bits; a backward before its recompute refused.

use super::common::*;

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
        let block = block_params(&r.params, layer);
        r.model
            .tp_block_forward(&mut r.acts, layer, block, &mut reduce)
            .unwrap();
    }
    let last = r.model.layout().final_norm_unit();
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
    let params = |l: usize| block_params(&r.params, l);
    let grads = block_grads(&mut r.grads, 2);
    r.model
        .tp_block_backward(&mut r.acts, 2, params(2), grads, &mut reduce)
        .unwrap();
    assert!(r.acts.needs_recompute(1));
    let [_, mg, rg] = block_grads(&mut r.grads, 1);
    let [_, mlp, replicated] = params(1);
    let err = r
        .model
        .tp_mlp_backward(&mut r.acts, 1, [mlp, replicated], mg, rg)
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
    let grads = block_grads(&mut r.grads, 1);
    r.model
        .tp_block_backward(&mut r.acts, 1, params(1), grads, &mut reduce)
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
