//! AdamW: agreement with an f64 reference, sharding invariance, decay masks, bad input.

use proptest::prelude::*;
use zero::optim::{AdamW, DecaySegment};
use zero::Error;

/// Straightforward f64 AdamW (PyTorch formulation) on one element.
fn reference(p: &mut f64, m: &mut f64, v: &mut f64, g: f64, t: i32, lr: f64, decay: bool) {
    let (b1, b2, eps, wd) = (0.9f64, 0.95f64, 1e-8f64, 0.1f64);
    if decay {
        *p -= lr * wd * *p;
    }
    *m = b1 * *m + (1.0 - b1) * g;
    *v = b2 * *v + (1.0 - b2) * g * g;
    let m_hat = *m / (1.0 - b1.powi(t));
    let v_hat = *v / (1.0 - b2.powi(t));
    *p -= lr * m_hat / (v_hat.sqrt() + eps);
}

/// Segments that tile `0..n` at the given cut points, alternating decay.
fn tiling(n: usize, mut cuts: Vec<usize>) -> Vec<DecaySegment> {
    cuts.retain(|&c| c > 0 && c < n);
    cuts.sort_unstable();
    cuts.dedup();
    let mut bounds = vec![0];
    bounds.extend(cuts);
    bounds.push(n);
    bounds
        .windows(2)
        .enumerate()
        .map(|(i, w)| DecaySegment {
            range: w[0]..w[1],
            decay: i % 2 == 0,
        })
        .collect()
}

fn decays_at(segments: &[DecaySegment], i: usize) -> bool {
    segments.iter().any(|s| s.range.contains(&i) && s.decay)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn matches_f64_reference_over_several_steps(
        init in prop::collection::vec(-2.0f32..2.0, 1..64),
        grads in prop::collection::vec(prop::collection::vec(-1.0f32..1.0, 64), 1..6),
        cuts in prop::collection::vec(0usize..64, 0..4),
        lr in 1e-4f32..1e-2,
    ) {
        let n = init.len();
        let segments = tiling(n, cuts);
        let opt = AdamW::default();
        let (mut p, mut m, mut v) = (init.clone(), vec![0.0f32; n], vec![0.0f32; n]);
        let mut rp: Vec<f64> = init.iter().map(|&x| f64::from(x)).collect();
        let (mut rm, mut rv) = (vec![0.0f64; n], vec![0.0f64; n]);
        for (k, g) in grads.iter().enumerate() {
            let t = k as u64 + 1;
            opt.update(&mut p, &g[..n], &mut m, &mut v, 0, &segments, t, lr).unwrap();
            for i in 0..n {
                reference(&mut rp[i], &mut rm[i], &mut rv[i], f64::from(g[i]), t as i32, f64::from(lr), decays_at(&segments, i));
            }
        }
        for i in 0..n {
            let err = (f64::from(p[i]) - rp[i]).abs();
            prop_assert!(err <= 1e-5 * (1.0 + rp[i].abs()), "element {}: got {}, reference {}", i, p[i], rp[i]);
        }
    }

    #[test]
    fn sharded_update_equals_whole_update_bitwise(
        init in prop::collection::vec(-2.0f32..2.0, 2..100),
        seed_grads in prop::collection::vec(-1.0f32..1.0, 100),
        cuts in prop::collection::vec(0usize..100, 0..5),
        shard_cuts in prop::collection::vec(0usize..100, 0..6),
        step in 1u64..1000,
    ) {
        let n = init.len();
        let g = &seed_grads[..n];
        let segments = tiling(n, cuts);
        let opt = AdamW::default();
        let m0: Vec<f32> = g.iter().map(|x| x * 0.1).collect();
        let v0: Vec<f32> = g.iter().map(|x| x * x * 0.5).collect();
        let (mut p, mut m, mut v) = (init.clone(), m0.clone(), v0.clone());
        opt.update(&mut p, g, &mut m, &mut v, 0, &segments, step, 3e-4).unwrap();

        let mut bounds: Vec<usize> = shard_cuts.into_iter().filter(|&c| c < n).collect();
        bounds.extend([0, n]);
        bounds.sort_unstable();
        bounds.dedup();
        let (mut sp, mut sm, mut sv) = (init, m0, v0);
        for w in bounds.windows(2) {
            let r = w[0]..w[1];
            // Each shard sees only the segments that intersect it, as the engine passes them.
            let local: Vec<DecaySegment> = segments.iter().filter(|s| s.range.start < r.end && s.range.end > r.start).cloned().collect();
            opt.update(&mut sp[r.clone()], &g[r.clone()], &mut sm[r.clone()], &mut sv[r.clone()], r.start, &local, step, 3e-4).unwrap();
        }
        let bits = |xs: &[f32]| xs.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        prop_assert_eq!(bits(&p), bits(&sp));
        prop_assert_eq!(bits(&m), bits(&sm));
        prop_assert_eq!(bits(&v), bits(&sv));
    }
}

#[test]
fn decay_applies_only_to_masked_segments() {
    // Zero gradient: Adam's term is 0, so only decay moves parameters.
    let opt = AdamW::default();
    let mut p = vec![1.0f32; 4];
    let (g, mut m, mut v) = (vec![0.0f32; 4], vec![0.0f32; 4], vec![0.0f32; 4]);
    let segs = [
        DecaySegment {
            range: 0..2,
            decay: true,
        },
        DecaySegment {
            range: 2..4,
            decay: false,
        },
    ];
    opt.update(&mut p, &g, &mut m, &mut v, 0, &segs, 1, 0.5)
        .unwrap();
    assert_eq!(p, vec![1.0 - 0.5 * 0.1, 1.0 - 0.5 * 0.1, 1.0, 1.0]);
}

#[test]
fn padding_outside_every_segment_is_untouched() {
    let opt = AdamW::default();
    let mut p = vec![1.0f32; 6];
    let (g, mut m, mut v) = (vec![1.0f32; 6], vec![0.0f32; 6], vec![0.0f32; 6]);
    // The shard is elements 10..16 of its unit; the unit's tensors end at 13.
    let segs = [DecaySegment {
        range: 0..13,
        decay: false,
    }];
    opt.update(&mut p, &g, &mut m, &mut v, 10, &segs, 1, 0.1)
        .unwrap();
    assert!(p[..3].iter().all(|&x| x < 1.0));
    assert_eq!(&p[3..], &[1.0; 3]);
    assert_eq!(&m[3..], &[0.0; 3]);
}

#[test]
fn first_step_moves_each_weight_by_about_lr() {
    // With bias correction, step 1 moves by lr * g / (|g| + eps) = lr * sign(g).
    let opt = AdamW {
        weight_decay: 0.0,
        ..AdamW::default()
    };
    let mut p = vec![0.0f32; 2];
    let (g, mut m, mut v) = (vec![0.3f32, -2.0], vec![0.0f32; 2], vec![0.0f32; 2]);
    opt.update(
        &mut p,
        &g,
        &mut m,
        &mut v,
        0,
        &[DecaySegment {
            range: 0..2,
            decay: true,
        }],
        1,
        0.01,
    )
    .unwrap();
    assert!(
        (p[0] + 0.01).abs() < 1e-7 && (p[1] - 0.01).abs() < 1e-7,
        "{p:?}"
    );
}

#[test]
fn inconsistent_input_is_an_error() {
    let opt = AdamW::default();
    let (mut p, g, mut m, mut v) = (
        vec![0.0f32; 3],
        vec![0.0f32; 2],
        vec![0.0f32; 3],
        vec![0.0f32; 3],
    );
    let seg = [DecaySegment {
        range: 0..3,
        decay: true,
    }];
    assert!(matches!(
        opt.update(&mut p, &g, &mut m, &mut v, 0, &seg, 1, 0.1),
        Err(Error::LengthMismatch { .. })
    ));
    let g = vec![0.0f32; 3];
    assert!(matches!(
        opt.update(&mut p, &g, &mut m, &mut v, 0, &seg, 0, 0.1),
        Err(Error::StepZero)
    ));
    let overlapping = [
        DecaySegment {
            range: 0..2,
            decay: true,
        },
        DecaySegment {
            range: 1..3,
            decay: false,
        },
    ];
    assert!(matches!(
        opt.update(&mut p, &g, &mut m, &mut v, 0, &overlapping, 1, 0.1),
        Err(Error::SegmentsUnordered { index: 1, .. })
    ));
    let bad = AdamW {
        beta2: 1.0,
        ..AdamW::default()
    };
    assert!(matches!(
        bad.update(&mut p, &g, &mut m, &mut v, 0, &seg, 1, 0.1),
        Err(Error::BadHyperParameter { what: "beta2", .. })
    ));
    assert!(matches!(
        opt.update(&mut p, &g, &mut m, &mut v, 0, &seg, 1, f32::NAN),
        Err(Error::BadHyperParameter { what: "lr", .. })
    ));
}

/// A segment long enough to be split into parallel tasks (a few times 2^16 elements and a
/// short tail) updates every element exactly as a one-element shard of it does.
#[test]
fn a_long_segment_split_into_tasks_equals_element_by_element_updates() {
    let n = 3 * (1 << 16) + 5;
    let opt = AdamW::default();
    let segments = [DecaySegment {
        range: 0..n,
        decay: true,
    }];
    let init = |i: usize| ((i % 101) as f32 * 1e-2, (i % 37) as f32 * 1e-3 - 0.018);
    let (mut p, g): (Vec<f32>, Vec<f32>) = (0..n).map(init).unzip();
    let (mut m, mut v) = (vec![0f32; n], vec![0f32; n]);
    let (mut p1, mut m1, mut v1) = (p.clone(), m.clone(), v.clone());
    for step in 1..=3 {
        opt.update(&mut p, &g, &mut m, &mut v, 0, &segments, step, 1e-3)
            .unwrap();
        for i in 0..n {
            let one = i..i + 1;
            let (pi, mi, vi) = (
                &mut p1[one.clone()],
                &mut m1[one.clone()],
                &mut v1[one.clone()],
            );
            opt.update(pi, &g[one], mi, vi, i, &segments, step, 1e-3)
                .unwrap();
        }
    }
    let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    assert!(bits(&p) == bits(&p1) && bits(&m) == bits(&m1) && bits(&v) == bits(&v1));
    // The equality means something only if the updates moved the parameters.
    let moved = (0..n).filter(|&i| p[i] != init(i).0).count();
    assert!(moved > n / 2, "{moved} of {n} parameters moved");
}
