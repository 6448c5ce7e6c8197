//! Calls out of order, mixed whole and split calls, and sizes that do not split: refused
//! with the error that names them.

use super::common::*;

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
    let [au, mu, ru] = ParamLayout::split_block_units(0);
    r.model
        .embed_forward(&mut r.acts, &r.params[0], &tokens)
        .unwrap();
    assert!(r.model.tp_partial(&mut r.acts).is_err(), "nothing due yet");
    r.model
        .tp_attention_forward(&mut r.acts, 0, &r.params[au], &r.params[ru])
        .unwrap();
    let err = r
        .model
        .tp_mlp_forward(&mut r.acts, 0, &r.params[mu], &r.params[ru])
        .unwrap_err();
    assert!(matches!(err, GptError::OutOfOrder { .. }), "{err}");
    assert_eq!(
        r.model.tp_partial(&mut r.acts).unwrap().len(),
        B * S * cfg.channels
    );
    assert!(r.model.tp_partial(&mut r.acts).is_err(), "handed out once");
    r.model
        .tp_mlp_forward(&mut r.acts, 0, &r.params[mu], &r.params[ru])
        .unwrap();
    let err = r.model.tp_block_output(&mut r.acts, 0).unwrap_err();
    assert!(matches!(err, GptError::OutOfOrder { .. }), "{err}");
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
    let wpe = r.model.layout().positions_unit().unwrap();
    let err = r
        .model
        .tp_embed_forward(&mut b.acts, &r.params[0], &r.params[wpe], &tokens);
    assert!(matches!(err, Err(GptError::BadBatch { .. })), "{err:?}");
    // The loss needs its statistics summed first.
    r.model
        .tp_embed_forward(&mut r.acts, &r.params[0], &r.params[wpe], &tokens)
        .unwrap();
    assert!(r.model.tp_head_loss(&mut r.acts).is_err());
}
