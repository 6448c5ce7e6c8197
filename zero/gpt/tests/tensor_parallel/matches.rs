//! A group of T ranks against the whole model (T = 1): losses and every gradient, other
//! shapes, the vocabulary split too, a missing reduction caught, replicated gradients the
//! same on every rank, the split init, the per-rank activations, random shapes.

use super::common::*;

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
    let last = ParamLayout::split(&cfg, 2).final_norm_unit();
    let mut units = vec![0, last];
    units.extend((0..cfg.num_layers).map(ParamLayout::replicated_unit));
    for unit in units {
        let (a, b) = (&group[0].grads[unit], &group[1].grads[unit]);
        assert!(a.iter().any(|&x| x != 0.0), "unit {unit} got no gradient");
        let same = a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(same, "unit {unit}: rank 0 and rank 1 differ");
    }
    // The slices differ: each rank holds its own part.
    for slice in [
        ParamLayout::attention_slice_unit(0),
        ParamLayout::mlp_slice_unit(0),
    ] {
        assert_ne!(group[0].grads[slice], group[1].grads[slice]);
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
    assert_eq!(vocab.num_units(), 3 * cfg.num_layers + 3);
    assert_eq!(vocab.num_layers(), cfg.num_layers);
    assert_eq!(vocab.positions_unit(), Some(3 * cfg.num_layers + 1));
    let wte = cfg.padded_vocab_size * cfg.channels;
    assert_eq!(4 * vocab.units()[0].len, wte);
    let layout = ParamLayout::split(&cfg, 2);
    assert_eq!(layout.num_layers(), cfg.num_layers);
    assert_eq!(layout.num_units(), 3 * cfg.num_layers + 2);
    // Block 0: attention slice (4C²/T + 3C/T), MLP slice (8C²/T + 4C/T), replicated (6C).
    let c = cfg.channels;
    let [attention, mlp, replicated] =
        ParamLayout::split_block_units(0).map(|u| layout.units()[u].len);
    assert_eq!(attention, (4 * c * c + 3 * c) / 2);
    assert_eq!(mlp, (8 * c * c + 4 * c) / 2);
    assert_eq!(replicated, 6 * c);
    let whole_block = ParamLayout::new(&cfg).units()[1].len;
    assert_eq!(2 * (attention + mlp) + replicated, whole_block);
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
    let mut units = vec![3 * layers + 1, 3 * layers + 2]; // wpe, final norm
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
