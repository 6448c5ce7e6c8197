//! Learning-rate schedule and gradient clipping helpers.

use zero::optim::{clip_coefficient, global_norm, sum_of_squares, CosineSchedule};

fn close(a: f32, b: f64) -> bool {
    (f64::from(a) - b).abs() <= 1e-6 * b.abs()
}

fn sched() -> CosineSchedule {
    CosineSchedule {
        max_lr: 6e-4,
        warmup_steps: 10,
        total_steps: 110,
        min_lr_frac: 0.1,
    }
}

#[test]
fn warmup_is_linear_and_reaches_max_at_its_last_step() {
    let s = sched();
    assert!(close(s.lr(0), 6e-5));
    assert!(close(s.lr(4), 3e-4));
    assert_eq!(s.lr(9), 6e-4);
    assert_eq!(s.lr(10), 6e-4, "cosine starts at the peak");
}

#[test]
fn cosine_passes_the_midpoint_and_ends_at_the_floor() {
    let s = sched();
    let mid = s.lr(60); // halfway through the 100 decay steps
    assert!(close(mid, 6e-5 + 0.5 * (6e-4 - 6e-5)), "{mid}");
    // 0.5 * (1 + cos(0.99 pi)) of the way from the floor to the peak.
    let coeff = 0.5 * (1.0 + (0.99 * std::f64::consts::PI).cos());
    assert!(close(s.lr(109), 6e-5 + coeff * (6e-4 - 6e-5)));
    assert!(close(s.lr(110), 6e-5));
    assert_eq!(s.lr(1_000_000), s.lr(110));
    assert!((11..110).all(|k| s.lr(k) < s.lr(k - 1)), "monotone decay");
}

#[test]
fn no_warmup_and_validation() {
    let s = CosineSchedule {
        warmup_steps: 0,
        ..sched()
    };
    assert_eq!(s.lr(0), 6e-4);
    assert!(s.validate().is_ok());
    assert!(CosineSchedule {
        min_lr_frac: 1.5,
        ..sched()
    }
    .validate()
    .is_err());
    assert!(CosineSchedule {
        warmup_steps: 200,
        ..sched()
    }
    .validate()
    .is_err());
    assert!(CosineSchedule {
        max_lr: f32::NAN,
        ..sched()
    }
    .validate()
    .is_err());
}

#[test]
fn global_norm_from_shards_equals_norm_of_whole() {
    let g: Vec<f32> = (0..100).map(|i| (i as f32 - 50.0) * 0.01).collect();
    let whole = sum_of_squares(&g).sqrt();
    let parts: Vec<f64> = g.chunks(30).map(sum_of_squares).collect();
    assert!((global_norm(&parts) - whole).abs() < 1e-12);
    // 3-4-5 triangle.
    assert_eq!(global_norm(&[9.0, 16.0]), 5.0);
}

#[test]
fn clip_coefficient_is_capped_at_one() {
    assert_eq!(clip_coefficient(0.5, 1.0), 1.0);
    assert!((clip_coefficient(4.0, 1.0) - 0.25).abs() < 1e-6);
    assert!(clip_coefficient(f64::INFINITY, 1.0).is_nan());
}
