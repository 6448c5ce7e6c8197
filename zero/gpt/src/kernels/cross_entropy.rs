//! Softmax + cross-entropy, fused and in place over the padded vocabulary.
//!
//! Legend: N = B*T rows, V vocabulary, Vp padded vocabulary (V <= Vp).
//!
//! One (N,Vp) buffer serves three roles in turn: logits, then probabilities (forward), then
//! d(logits) (backward). At GPT-2 shape with B*T = 4096 that buffer is 824 MB, so keeping
//! separate logits/probs/dlogits (llm.c's CPU layout) would triple the largest activation.
//! Columns V..Vp are padding: forward gives them probability 0 and backward gradient 0, so
//! they never touch the loss whatever the padded rows of the embedding hold.

use rayon::prelude::*;

use super::{math, ROWS_PER_TASK};

/// `losses[i] = -log softmax(logits[i, ..V])[targets[i]]`; `logits` is overwritten with the
/// probabilities (zero in the padded columns).
///
/// `losses` (N,), `logits` (N,Vp) in: logits, out: probs, `targets` (N,) with ids < V.
///
/// # Panics
/// On slice lengths that do not match the dimensions, `v > vp`, or a target >= V.
pub fn crossentropy_forward(
    losses: &mut [f32],
    logits: &mut [f32],
    targets: &[u32],
    n: usize,
    v: usize,
    vp: usize,
) {
    assert!(v <= vp);
    assert_eq!(losses.len(), n);
    assert_eq!(logits.len(), n * vp);
    assert_eq!(targets.len(), n);
    logits
        .par_chunks_mut(ROWS_PER_TASK * vp)
        .zip(
            losses
                .par_chunks_mut(ROWS_PER_TASK)
                .zip(targets.par_chunks(ROWS_PER_TASK)),
        )
        .for_each(|(logits, (losses, targets))| {
            for ((row, loss), &target) in logits.chunks_exact_mut(vp).zip(losses).zip(targets) {
                let target = target as usize;
                assert!(target < v, "target {target} >= vocab {v}");
                let (real, pad) = row.split_at_mut(v);
                let max = math::max(real);
                let target_logit = real[target];
                let sum = math::exp_shifted_sum(real, max);
                // log-sum-exp form: exact even when the target's probability underflows.
                *loss = max + sum.ln() - target_logit;
                let inv = 1.0 / sum;
                for x in real.iter_mut() {
                    *x *= inv;
                }
                pad.fill(0.0);
            }
        });
}

/// Turns the probabilities left by `crossentropy_forward` into d(logits), in place:
/// `dlogits[i,j] = (probs[i,j] - [j == targets[i]]) * dlosses[i]` for j < V, 0 for j >= V.
///
/// `probs` (N,Vp) in: probs, out: dlogits, `dlosses` (N,) (1/N each for a mean loss),
/// `targets` (N,). It overwrites rather than accumulates: the buffer holds no earlier
/// gradient to add to.
///
/// # Panics
/// On slice lengths that do not match the dimensions, `v > vp`, or a target >= V.
pub fn crossentropy_backward(
    probs: &mut [f32],
    dlosses: &[f32],
    targets: &[u32],
    n: usize,
    v: usize,
    vp: usize,
) {
    assert!(v <= vp);
    assert_eq!(probs.len(), n * vp);
    assert_eq!(dlosses.len(), n);
    assert_eq!(targets.len(), n);
    probs
        .par_chunks_mut(ROWS_PER_TASK * vp)
        .zip(
            dlosses
                .par_chunks(ROWS_PER_TASK)
                .zip(targets.par_chunks(ROWS_PER_TASK)),
        )
        .for_each(|(probs, (dlosses, targets))| {
            for ((row, &dl), &target) in probs.chunks_exact_mut(vp).zip(dlosses).zip(targets) {
                let target = target as usize;
                assert!(target < v, "target {target} >= vocab {v}");
                let (real, pad) = row.split_at_mut(v);
                for p in real.iter_mut() {
                    *p *= dl;
                }
                real[target] -= dl;
                pad.fill(0.0);
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::fd;

    #[test]
    fn backward_matches_finite_differences_and_ignores_padding() {
        let (n, v, vp) = (3, 5, 8);
        let logits = fd::random(n * vp, 1, 3.0);
        let targets = [4u32, 0, 2];
        let dlosses = fd::random(n, 2, 1.0);
        let loss = |x: &[f32]| {
            let mut buf = x.to_vec();
            let mut losses = vec![0.0; n];
            crossentropy_forward(&mut losses, &mut buf, &targets, n, v, vp);
            fd::dot(&dlosses, &losses)
        };
        let mut grad = logits.clone();
        let mut losses = vec![0.0; n];
        crossentropy_forward(&mut losses, &mut grad, &targets, n, v, vp);
        crossentropy_backward(&mut grad, &dlosses, &targets, n, v, vp);
        fd::check("dlogits", &logits, &grad, 1e-3, 2e-3, loss);
        for row in grad.chunks(vp) {
            assert!(row[v..].iter().all(|&g| g == 0.0));
        }
    }

    #[test]
    fn uniform_logits_give_log_v() {
        let (n, v, vp) = (2, 100, 128);
        // Huge padded logits must not change anything: they are masked.
        let mut logits: Vec<f32> = (0..n * vp)
            .map(|i| if i % vp < v { 0.5 } else { 1e9 })
            .collect();
        let mut losses = vec![0.0; n];
        crossentropy_forward(&mut losses, &mut logits, &[3, 99], n, v, vp);
        for l in losses {
            assert!((l - (v as f32).ln()).abs() < 1e-5, "{l}");
        }
    }
}
