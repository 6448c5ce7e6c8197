//! End-to-end behaviour of the model: loss at init, overfitting one batch, determinism, and
//! the per-unit API against the convenience driver.

use zero_gpt::{init_params, Gpt, GptConfig, GptError, Rng};

fn zeros(model: &Gpt) -> Vec<Vec<f32>> {
    model
        .layout()
        .unit_lens()
        .iter()
        .map(|&n| vec![0.0; n])
        .collect()
}

fn random_ids(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut rng = Rng::new(seed);
    (0..n)
        .map(|_| (rng.next_u64() % vocab as u64) as u32)
        .collect()
}

/// Plain AdamW for the tests (the real optimizer lives in `zero::optim`). Decay follows the
/// size table's per-tensor flag.
struct AdamW {
    m: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    decay: Vec<Vec<bool>>,
    step: i32,
}

impl AdamW {
    fn new(model: &Gpt) -> Self {
        let decay = model
            .layout()
            .units()
            .iter()
            .map(|u| {
                u.tensors
                    .iter()
                    .flat_map(|t| std::iter::repeat_n(t.weight_decay, t.len))
                    .collect()
            })
            .collect();
        Self {
            m: zeros(model),
            v: zeros(model),
            decay,
            step: 0,
        }
    }

    fn update(&mut self, params: &mut [Vec<f32>], grads: &[Vec<f32>], lr: f32, wd: f32) {
        let (b1, b2, eps) = (0.9f32, 0.95f32, 1e-8f32);
        self.step += 1;
        let (c1, c2) = (1.0 - b1.powi(self.step), 1.0 - b2.powi(self.step));
        for u in 0..params.len() {
            for i in 0..params[u].len() {
                let g = grads[u][i];
                self.m[u][i] = b1 * self.m[u][i] + (1.0 - b1) * g;
                self.v[u][i] = b2 * self.v[u][i] + (1.0 - b2) * g * g;
                let update = (self.m[u][i] / c1) / ((self.v[u][i] / c2).sqrt() + eps);
                let decay = if self.decay[u][i] {
                    wd * params[u][i]
                } else {
                    0.0
                };
                params[u][i] -= lr * (update + decay);
            }
        }
    }
}

#[test]
fn loss_at_init_is_about_ln_vocab() {
    for (config, b, t) in [(GptConfig::tiny(), 4, 32), (GptConfig::small(), 1, 16)] {
        let model = Gpt::new(config).unwrap();
        let params = init_params(&config, model.layout(), 1);
        let mut acts = model.activations(b, t).unwrap();
        let tokens = random_ids(b * t, config.vocab_size, 2);
        let targets = random_ids(b * t, config.vocab_size, 3);
        let loss = model
            .forward(&mut acts, &params, &tokens, Some(&targets))
            .unwrap()
            .unwrap();
        let ln_v = (config.vocab_size as f32).ln();
        assert!((loss - ln_v).abs() < 0.15, "loss {loss} vs ln V {ln_v}");
    }
}

#[test]
fn tiny_model_overfits_one_batch() {
    let config = GptConfig::tiny();
    let model = Gpt::new(config).unwrap();
    let mut params = init_params(&config, model.layout(), 7);
    let mut grads = zeros(&model);
    let mut opt = AdamW::new(&model);
    let (b, t) = (2, 16);
    let mut acts = model.activations(b, t).unwrap();
    let tokens = random_ids(b * t, config.vocab_size, 8);
    let targets = random_ids(b * t, config.vocab_size, 9);
    let mut losses = Vec::new();
    for _ in 0..300 {
        grads.iter_mut().for_each(|g| g.fill(0.0));
        losses.push(
            model
                .forward_backward(&mut acts, &params, &mut grads, &tokens, &targets)
                .unwrap(),
        );
        opt.update(&mut params, &grads, 1e-2, 0.01);
    }
    let last = *losses.last().unwrap();
    assert!(
        last < 0.1,
        "loss after 300 steps {last} (first {})",
        losses[0]
    );
    // Padded vocabulary rows are never looked up and their logits are masked: they get no
    // gradient, and are not decayed away from zero either.
    let real = config.vocab_size * config.channels;
    assert!(params[0][real..config.padded_vocab_size * config.channels]
        .iter()
        .all(|&x| x == 0.0));
}

#[test]
fn two_runs_give_the_same_loss_to_the_bit() {
    let run = || {
        let config = GptConfig::tiny();
        let model = Gpt::new(config).unwrap();
        let mut params = init_params(&config, model.layout(), 11);
        let mut grads = zeros(&model);
        let mut opt = AdamW::new(&model);
        let mut acts = model.activations(4, 32).unwrap();
        let tokens = random_ids(128, config.vocab_size, 12);
        let targets = random_ids(128, config.vocab_size, 13);
        let mut losses = Vec::new();
        for _ in 0..5 {
            grads.iter_mut().for_each(|g| g.fill(0.0));
            losses.push(
                model
                    .forward_backward(&mut acts, &params, &mut grads, &tokens, &targets)
                    .unwrap()
                    .to_bits(),
            );
            opt.update(&mut params, &grads, 1e-3, 0.1);
        }
        (losses, grads)
    };
    assert_eq!(run(), run());
}

#[test]
fn unit_calls_match_forward_backward_and_accumulate() {
    let config = GptConfig::tiny();
    let model = Gpt::new(config).unwrap();
    let params = init_params(&config, model.layout(), 21);
    let (b, t) = (2, 8);
    let tokens = random_ids(b * t, config.vocab_size, 22);
    let targets = random_ids(b * t, config.vocab_size, 23);
    let mut acts = model.activations(b, t).unwrap();
    let mut once = zeros(&model);
    let loss = model
        .forward_backward(&mut acts, &params, &mut once, &tokens, &targets)
        .unwrap();

    // The same pass driven unit by unit: bitwise the same gradients. A second pass into the
    // same buffers accumulates (sums are reassociated, so compare to 2x within rounding).
    let mut unit_grads = zeros(&model);
    let last = model.layout().final_norm_unit();
    for pass in 0..2 {
        model.embed_forward(&mut acts, &params[0], &tokens).unwrap();
        for l in 0..config.num_layers {
            model.block_forward(&mut acts, l, &params[l + 1]).unwrap();
        }
        let unit_loss = model
            .head_forward(&mut acts, &params[last], &params[0], Some(&targets))
            .unwrap();
        assert_eq!(unit_loss, Some(loss));
        let (embed_grad, rest) = unit_grads.split_at_mut(1);
        model
            .head_backward(
                &mut acts,
                &params[last],
                &params[0],
                &mut rest[last - 1],
                &mut embed_grad[0],
            )
            .unwrap();
        for l in (0..config.num_layers).rev() {
            model
                .block_backward(&mut acts, l, &params[l + 1], &mut rest[l])
                .unwrap();
        }
        model.embed_backward(&mut acts, &mut embed_grad[0]).unwrap();
        if pass == 0 {
            assert_eq!(unit_grads, once);
        }
    }
    let scale = once.iter().flatten().fold(0.0f32, |m, g| m.max(g.abs()));
    for (a, b) in once.iter().flatten().zip(unit_grads.iter().flatten()) {
        assert!((2.0 * a - b).abs() <= 1e-5 * scale, "{a} {b}");
    }
}

#[test]
fn logits_path_stops_before_the_loss() {
    let config = GptConfig::tiny();
    let model = Gpt::new(config).unwrap();
    let params = init_params(&config, model.layout(), 31);
    let mut acts = model.activations(1, 4).unwrap();
    let out = model
        .forward(&mut acts, &params, &[1, 2, 3, 4], None)
        .unwrap();
    assert_eq!(out, None);
    let logits = model.logits(&acts).unwrap();
    assert_eq!(logits.len(), 4 * config.padded_vocab_size);
    // No targets, no backward.
    let mut grads = zeros(&model);
    let (e, rest) = grads.split_at_mut(1);
    let err = model
        .head_backward(&mut acts, &params[3], &params[0], &mut rest[2], &mut e[0])
        .unwrap_err();
    assert!(
        matches!(
            err,
            GptError::OutOfOrder {
                call: "head_backward",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn bad_inputs_are_errors_not_panics() {
    let config = GptConfig::tiny();
    let model = Gpt::new(config).unwrap();
    let params = init_params(&config, model.layout(), 41);
    let mut acts = model.activations(1, 4).unwrap();
    let err = model
        .forward(&mut acts, &params, &[1, 2, 100, 4], None)
        .unwrap_err();
    assert_eq!(
        err,
        GptError::TokenOutOfRange {
            what: "tokens",
            index: 2,
            id: 100,
            vocab_size: 100
        }
    );
    let err = model
        .forward(&mut acts, &params, &[1, 2, 3], None)
        .unwrap_err();
    assert!(
        matches!(
            err,
            GptError::SizeMismatch {
                what: "tokens",
                expected: 4,
                got: 3
            }
        ),
        "{err}"
    );
    let err = model
        .forward(&mut acts, &params[..2], &[1, 2, 3, 4], None)
        .unwrap_err();
    assert!(matches!(err, GptError::SizeMismatch { .. }), "{err}");
    let err = model
        .embed_forward(&mut acts, &params[1], &[1, 2, 3, 4])
        .unwrap_err();
    assert!(matches!(err, GptError::SizeMismatch { .. }), "{err}");
    assert!(matches!(
        model.activations(1, 33),
        Err(GptError::BadBatch { .. })
    ));
    assert!(matches!(
        model.activations(0, 4),
        Err(GptError::BadBatch { .. })
    ));
    // Activations sized for another model.
    let other = Gpt::new(GptConfig::new(32, 100, 2, 4, 32).unwrap()).unwrap();
    let mut foreign = other.activations(1, 4).unwrap();
    let err = model
        .forward(&mut foreign, &params, &[1, 2, 3, 4], None)
        .unwrap_err();
    assert!(matches!(err, GptError::BadBatch { .. }), "{err}");
    // A block before the embedding, or out of order, or past L.
    let mut fresh = model.activations(1, 4).unwrap();
    assert!(matches!(
        model.block_forward(&mut fresh, 0, &params[1]),
        Err(GptError::OutOfOrder { .. })
    ));
    model
        .embed_forward(&mut fresh, &params[0], &[1, 2, 3, 4])
        .unwrap();
    assert!(matches!(
        model.block_forward(&mut fresh, 1, &params[2]),
        Err(GptError::OutOfOrder { .. })
    ));
    assert!(matches!(
        model.block_forward(&mut fresh, 2, &params[2]),
        Err(GptError::NoSuchLayer { .. })
    ));
}

#[test]
fn results_do_not_depend_on_the_thread_count() {
    // Every reduction has a fixed order whatever the pool size (rows per task, gemm's split
    // over output tiles only), so 1 and 3 threads agree to the bit. C = 128 and B*T = 256 put
    // the MLP matmuls (256 x 128 x 512) above gemm's threading threshold (48 * 48 * 256).
    let config = GptConfig::new(64, 100, 1, 2, 128).unwrap();
    let model = Gpt::new(config).unwrap();
    let params = init_params(&config, model.layout(), 51);
    let tokens = random_ids(4 * 64, config.vocab_size, 52);
    let targets = random_ids(4 * 64, config.vocab_size, 53);
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            let mut acts = model.activations(4, 64).unwrap();
            let mut grads = zeros(&model);
            let loss = model
                .forward_backward(&mut acts, &params, &mut grads, &tokens, &targets)
                .unwrap();
            (loss.to_bits(), grads)
        })
    };
    assert!(run(1) == run(3));
}
