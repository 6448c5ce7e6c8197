//! Property tests: the CPU kernels against plain f64 references on random small shapes.

use proptest::prelude::*;
use zero_gpt::kernels::{attention, cross_entropy, layernorm, matmul};
use zero_gpt::Rng;

fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    (0..n).map(|_| (rng.uniform() * 2.0 - 1.0) as f32).collect()
}

fn close(got: f32, want: f64, tol: f64) -> bool {
    (f64::from(got) - want).abs() <= tol * (1.0 + want.abs())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn matmul_matches_f64_reference(n in 1usize..40, c in 1usize..70, oc in 1usize..70, seed: u64) {
        let (x, w) = (random(n * c, seed), random(oc * c, seed ^ 1));
        let (b, dout) = (random(oc, seed ^ 2), random(n * oc, seed ^ 3));
        let mut out = vec![0.0; n * oc];
        matmul::matmul_forward(&mut out, &x, &w, Some(&b), n, c, oc);
        let (mut dx, mut dw, mut db) = (vec![0.0; n * c], vec![0.0; oc * c], vec![0.0; oc]);
        matmul::matmul_backward(&mut dx, &mut dw, Some(&mut db), &dout, &x, &w, n, c, oc);
        let f = |v: f32| f64::from(v);
        for i in 0..n {
            for o in 0..oc {
                let want = f(b[o]) + (0..c).map(|k| f(x[i * c + k]) * f(w[o * c + k])).sum::<f64>();
                prop_assert!(close(out[i * oc + o], want, 1e-5));
            }
            for k in 0..c {
                let want: f64 = (0..oc).map(|o| f(dout[i * oc + o]) * f(w[o * c + k])).sum();
                prop_assert!(close(dx[i * c + k], want, 1e-5));
            }
        }
        for o in 0..oc {
            for k in 0..c {
                let want: f64 = (0..n).map(|i| f(dout[i * oc + o]) * f(x[i * c + k])).sum();
                prop_assert!(close(dw[o * c + k], want, 1e-5));
            }
            let want: f64 = (0..n).map(|i| f(dout[i * oc + o])).sum();
            prop_assert!(close(db[o], want, 1e-5));
        }
    }

    #[test]
    fn cross_entropy_matches_f64_reference(
        n in 1usize..8, v in 1usize..300, pad in 0usize..40, seed: u64,
    ) {
        let vp = v + pad;
        let logits: Vec<f32> = random(n * vp, seed).iter().map(|x| x * 20.0).collect();
        let targets: Vec<u32> = (0..n).map(|i| ((seed as usize + i * 31) % v) as u32).collect();
        let mut probs = logits.clone();
        let mut losses = vec![0.0; n];
        cross_entropy::crossentropy_forward(&mut losses, &mut probs, &targets, n, v, vp);
        for i in 0..n {
            let row: Vec<f64> = logits[i * vp..i * vp + v].iter().map(|&x| f64::from(x)).collect();
            let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let lse = max + row.iter().map(|x| (x - max).exp()).sum::<f64>().ln();
            prop_assert!(close(losses[i], lse - row[targets[i] as usize], 1e-5));
            for j in 0..vp {
                let want = if j < v { (row[j] - lse).exp() } else { 0.0 };
                prop_assert!((f64::from(probs[i * vp + j]) - want).abs() < 1e-6);
            }
        }
    }

    #[test]
    fn attention_matches_f64_reference(
        b in 1usize..3, t in 1usize..12, nh in 1usize..4, hs in 1usize..9, seed: u64,
    ) {
        let c = nh * hs;
        let qkv = random(b * t * 3 * c, seed);
        let (mut out, mut att) = (vec![0.0; b * t * c], vec![0.0; b * t * nh * t]);
        attention::attention_forward(&mut out, &mut att, &qkv, b, t, c, nh);
        let at = |bi: usize, ti: usize, col: usize| f64::from(qkv[(bi * t + ti) * 3 * c + col]);
        for bi in 0..b {
            for ti in 0..t {
                for h in 0..nh {
                    let scores: Vec<f64> = (0..=ti)
                        .map(|t2| {
                            let qk: f64 = (0..hs)
                                .map(|i| at(bi, ti, h * hs + i) * at(bi, t2, c + h * hs + i))
                                .sum();
                            qk / (hs as f64).sqrt()
                        })
                        .collect();
                    let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let z: f64 = scores.iter().map(|s| (s - max).exp()).sum();
                    for i in 0..hs {
                        let want: f64 = (0..=ti)
                            .map(|t2| (scores[t2] - max).exp() / z * at(bi, t2, 2 * c + h * hs + i))
                            .sum();
                        prop_assert!(close(out[(bi * t + ti) * c + h * hs + i], want, 1e-5));
                    }
                }
            }
        }
    }

    #[test]
    fn layernorm_matches_f64_reference(n in 1usize..6, c in 1usize..100, seed: u64) {
        let (x, w, bias) = (random(n * c, seed), random(c, seed ^ 1), random(c, seed ^ 2));
        let (mut out, mut mean, mut rstd) = (vec![0.0; n * c], vec![0.0; n], vec![0.0; n]);
        layernorm::layernorm_forward(&mut out, &mut mean, &mut rstd, &x, &w, &bias, n, c);
        for i in 0..n {
            let row: Vec<f64> = x[i * c..(i + 1) * c].iter().map(|&v| f64::from(v)).collect();
            let mu = row.iter().sum::<f64>() / c as f64;
            let var = row.iter().map(|v| (v - mu).powi(2)).sum::<f64>() / c as f64;
            let s = 1.0 / (var + 1e-5).sqrt();
            for j in 0..c {
                let want = (row[j] - mu) * s * f64::from(w[j]) + f64::from(bias[j]);
                prop_assert!(close(out[i * c + j], want, 1e-4));
            }
        }
    }
}
