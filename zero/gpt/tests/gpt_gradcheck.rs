//! The whole model's gradient against central finite differences of its loss, on `tiny`.

use zero_gpt::{init_params, Gpt, GptConfig, Rng};

const B: usize = 2;
const T: usize = 8;

/// Parameters away from init (so no tensor is all zeros or all ones and every path carries
/// gradient): each unit's init values plus uniform noise.
fn perturbed_params(model: &Gpt, seed: u64) -> Vec<Vec<f32>> {
    let mut rng = Rng::new(seed);
    let mut params = init_params(model.config(), model.layout(), seed);
    for (unit, buf) in model.layout().units().iter().zip(&mut params) {
        for t in &unit.tensors {
            // Padded wte rows stay zero as in training (their gradient is exactly zero).
            let end = if t.name == "wte" {
                model.config().vocab_size * model.config().channels
            } else {
                t.len
            };
            for x in &mut buf[t.offset..t.offset + end] {
                *x += ((rng.uniform() - 0.5) * 0.4) as f32;
            }
        }
    }
    params
}

fn batch(seed: u64, vocab: u32) -> (Vec<u32>, Vec<u32>) {
    let mut rng = Rng::new(seed);
    let tokens = (0..B * T)
        .map(|_| (rng.next_u64() % u64::from(vocab)) as u32)
        .collect();
    let targets = (0..B * T)
        .map(|_| (rng.next_u64() % u64::from(vocab)) as u32)
        .collect();
    (tokens, targets)
}

#[test]
fn model_gradient_matches_finite_differences() {
    let model = Gpt::new(GptConfig::tiny()).unwrap();
    let mut params = perturbed_params(&model, 5);
    let (tokens, targets) = batch(6, 100);
    let mut acts = model.activations(B, T).unwrap();
    let mut grads: Vec<Vec<f32>> = model
        .layout()
        .unit_lens()
        .iter()
        .map(|&n| vec![0.0; n])
        .collect();
    model
        .forward_backward(&mut acts, &params, &mut grads, &tokens, &targets)
        .unwrap();

    // The loss as f64 sum of per-position f32 losses, divided by N: the same function the
    // gradient is of, reduced without extra rounding.
    let loss = |params: &[Vec<f32>], acts: &mut zero_gpt::Activations| -> f64 {
        model
            .forward(acts, params, &tokens, Some(&targets))
            .unwrap();
        acts.losses()
            .unwrap()
            .iter()
            .map(|&l| f64::from(l))
            .sum::<f64>()
            / (B * T) as f64
    };
    let mut rng = Rng::new(7);
    let eps = 1e-2f32;
    let (mut worst, mut at) = (0.0f64, String::new());
    for (unit_idx, unit) in model.layout().units().iter().enumerate() {
        for t in &unit.tensors {
            let g = &grads[unit_idx][t.offset..t.offset + t.len];
            let scale = g.iter().map(|&x| f64::from(x).abs()).fold(0.0, f64::max);
            for _ in 0..4 {
                let i = t.offset + (rng.next_u64() % t.len as u64) as usize;
                let orig = params[unit_idx][i];
                params[unit_idx][i] = orig + eps;
                let up = loss(&params, &mut acts);
                params[unit_idx][i] = orig - eps;
                let down = loss(&params, &mut acts);
                params[unit_idx][i] = orig;
                let numeric = (up - down) / (2.0 * f64::from(eps));
                let analytic = f64::from(grads[unit_idx][i]);
                let err = (numeric - analytic).abs() / scale.max(1e-4);
                if err >= worst {
                    worst = err;
                    at = format!(
                        "unit {unit_idx} {}[{}]: analytic {analytic:.6e}, numeric {numeric:.6e}",
                        t.name,
                        i - t.offset
                    );
                }
            }
        }
    }
    assert!(worst < 5e-3, "worst scaled error {worst:.2e} at {at}");
}
