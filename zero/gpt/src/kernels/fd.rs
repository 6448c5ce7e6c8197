//! Finite-difference helpers for the kernel tests.

use crate::init::Rng;

/// `n` values uniform in [-scale, scale), from `seed`.
pub(crate) fn random(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    (0..n)
        .map(|_| ((rng.uniform() * 2.0 - 1.0) as f32) * scale)
        .collect()
}

/// sum_i w_i * out_i in f64: the scalar whose gradient wrt `out` is `w`.
pub(crate) fn dot(w: &[f32], out: &[f32]) -> f64 {
    w.iter()
        .zip(out)
        .map(|(&a, &b)| f64::from(a) * f64::from(b))
        .sum()
}

/// Checks `analytic` (the gradient of `f` at `x`) against central differences, coordinate by
/// coordinate. `f` runs the f32 forward and reduces in f64, so rounding noise stays near
/// 1e-7 * |f| / eps; the tolerance is relative to the gradient's overall scale.
pub(crate) fn check(
    what: &str,
    x: &[f32],
    analytic: &[f32],
    eps: f32,
    tol: f64,
    f: impl Fn(&[f32]) -> f64,
) {
    assert_eq!(x.len(), analytic.len(), "{what}");
    let scale = analytic
        .iter()
        .map(|&a| f64::from(a).abs())
        .fold(0.0, f64::max)
        .max(1e-3);
    let mut probe = x.to_vec();
    for i in 0..x.len() {
        let orig = probe[i];
        probe[i] = orig + eps;
        let up = f(&probe);
        let hi = probe[i];
        probe[i] = orig - eps;
        let down = f(&probe);
        let lo = probe[i];
        probe[i] = orig;
        let numeric = (up - down) / (f64::from(hi) - f64::from(lo));
        let err = (numeric - f64::from(analytic[i])).abs() / scale;
        assert!(
            err < tol,
            "{what}[{i}]: analytic {} numeric {numeric} (scaled error {err:.2e})",
            analytic[i]
        );
    }
}
