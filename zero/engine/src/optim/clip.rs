//! Global gradient-norm clipping from per-shard partial sums.
//!
//! Each rank computes [`sum_of_squares`] of its gradient shards; the sums are gathered and
//! combined by [`global_norm`] in rank order on every rank, so every rank computes the same
//! norm to the bit (a reduction whose order varied by rank could disagree in the last bit
//! and make ranks clip differently).

/// Sum of squares of `xs`, accumulated in f64 (in index order).
pub fn sum_of_squares(xs: &[f32]) -> f64 {
    xs.iter().map(|&x| f64::from(x) * f64::from(x)).sum()
}

/// The global L2 norm from partial sums of squares, added in the order given.
pub fn global_norm(partial_sums: &[f64]) -> f64 {
    partial_sums.iter().fold(0.0, |acc, &s| acc + s).sqrt()
}

/// The factor to multiply gradients by: `max_norm / (norm + 1e-6)`, capped at 1 (as
/// `torch.nn.utils.clip_grad_norm_`). A non-finite norm gives NaN rather than 0, which
/// would silently zero the step: the caller's overflow check must see it and skip the step.
pub fn clip_coefficient(norm: f64, max_norm: f64) -> f32 {
    if !norm.is_finite() {
        return f32::NAN;
    }
    (max_norm / (norm + 1e-6)).min(1.0) as f32
}
