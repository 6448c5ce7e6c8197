//! The embedding and the cross-entropy over a vocabulary split between the T ranks of a
//! tensor-parallel group (Megatron's vocab-parallel embedding and loss): rank r holds rows
//! `first..first + width` of the padded `wte` (Vp/T rows each), so its logits are those
//! columns only.
//!
//! Legend: B batch, S sequence, C channels, N = B*S rows, V vocabulary, Vp padded
//! vocabulary, T the tensor-parallel size, W = Vp/T this rank's columns.
//!
//! The loss needs the log-sum-exp over the whole vocabulary and the target's logit, which
//! one rank holds: each rank writes its own log-sum-exp in column `rank` of an (N, T+1)
//! statistics row and the target's logit (if it holds it) in column T, zeros elsewhere, so
//! one sum over the group gives every rank every statistic, exactly (each entry is one
//! rank's value plus zeros). Columns at or past V are padding: no probability, no gradient.

use rayon::prelude::*;

use super::math;

/// This rank's part of the padded vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VocabSlice {
    /// The first id it holds (`rank * W`).
    pub first: usize,
    /// W, the ids it holds.
    pub width: usize,
    /// V: ids at or past it are padding.
    pub vocab: usize,
}

impl VocabSlice {
    /// Rank `rank`'s part of a padded vocabulary of `vp` ids (V = `vocab`) split `tp` ways.
    #[must_use]
    pub fn new(vocab: usize, vp: usize, tp: usize, rank: usize) -> Self {
        let width = vp / tp;
        Self {
            first: rank * width,
            width,
            vocab,
        }
    }

    /// Its real (not padding) columns, a prefix of its W.
    #[must_use]
    pub fn real(&self) -> usize {
        self.vocab.saturating_sub(self.first).min(self.width)
    }

    /// The local row of id `id`, if this rank holds it.
    #[must_use]
    pub fn local(&self, id: u32) -> Option<usize> {
        (id as usize)
            .checked_sub(self.first)
            .filter(|&i| i < self.width)
    }
}

/// `out[b,s,:] = wte_r[tokens[b,s] - first,:]` for the tokens this rank holds, 0 for the
/// others, plus `wpe[s,:]` when `wpe` is given (one rank of the group adds it). Summed over
/// the group, the T = 1 encoder's output.
///
/// `out` (B,S,C), `tokens` (B,S), `wte` (W,C), `wpe` (maxS,C).
///
/// # Panics
/// On slice lengths that do not match the dimensions.
pub fn embed_forward(
    out: &mut [f32],
    tokens: &[u32],
    wte: &[f32],
    wpe: Option<&[f32]>,
    vocab: VocabSlice,
    s: usize,
    c: usize,
) {
    assert_eq!(out.len(), tokens.len() * c);
    assert_eq!(wte.len(), vocab.width * c);
    out.par_chunks_mut(c)
        .zip(tokens.par_iter())
        .enumerate()
        .for_each(|(row, (o, &tok))| {
            match vocab.local(tok) {
                Some(i) => o.copy_from_slice(&wte[i * c..(i + 1) * c]),
                None => o.fill(0.0),
            }
            if let Some(wpe) = wpe {
                let pos = row % s;
                for (o, &p) in o.iter_mut().zip(&wpe[pos * c..(pos + 1) * c]) {
                    *o += p;
                }
            }
        });
}

/// `dwte_r[tokens[b,s] - first,:] += dout[b,s,:]` for the tokens this rank holds, and
/// `dwpe[s,:] += dout[b,s,:]` (the whole d(wpe): every rank holds the same `dout`).
/// Sequential, as the T = 1 encoder's backward, for the same determinism.
///
/// # Panics
/// On slice lengths that do not match the dimensions.
pub fn embed_backward(
    dwte: &mut [f32],
    dwpe: &mut [f32],
    dout: &[f32],
    tokens: &[u32],
    vocab: VocabSlice,
    s: usize,
    c: usize,
) {
    assert_eq!(dout.len(), tokens.len() * c);
    assert_eq!(dwte.len(), vocab.width * c);
    assert!(dwpe.len() >= s * c);
    for (row, (d, &tok)) in dout.chunks_exact(c).zip(tokens).enumerate() {
        if let Some(i) = vocab.local(tok) {
            for (w, &g) in dwte[i * c..(i + 1) * c].iter_mut().zip(d) {
                *w += g;
            }
        }
        let pos = row % s;
        for (w, &g) in dwpe[pos * c..(pos + 1) * c].iter_mut().zip(d) {
            *w += g;
        }
    }
}

/// This rank's loss statistics, `stats` (N, T+1): row i zeroed, then column `rank` = the
/// log-sum-exp of row i's real logits (−∞ when it holds no real id) and column T = the
/// target's logit when this rank holds the target.
///
/// `logits` (N,W) (read only), `targets` (N,).
///
/// # Panics
/// On slice lengths that do not match the dimensions, or `rank >= tp`.
pub fn loss_stats(
    stats: &mut [f32],
    logits: &[f32],
    targets: &[u32],
    vocab: VocabSlice,
    rank: usize,
    tp: usize,
) {
    assert!(rank < tp);
    assert_eq!(stats.len(), targets.len() * (tp + 1));
    assert_eq!(logits.len(), targets.len() * vocab.width);
    let real = vocab.real();
    stats
        .par_chunks_mut(tp + 1)
        .zip(logits.par_chunks(vocab.width).zip(targets.par_iter()))
        .for_each(|(st, (row, &target))| {
            st.fill(0.0);
            let row = &row[..real];
            let max = math::max(row);
            st[rank] = if real == 0 {
                f32::NEG_INFINITY
            } else {
                let sum: f32 = row.iter().map(|&x| math::exp(x - max)).sum();
                max + sum.ln()
            };
            if let Some(i) = vocab.local(target) {
                st[tp] = row[i];
            }
        });
}

/// From the statistics summed over the group: `losses[i]` = log-sum-exp over the ranks'
/// log-sum-exps minus the target's logit, and `logits` (N,W) overwritten with this rank's
/// probabilities (0 in the padding columns), ready for [`loss_backward`].
///
/// # Panics
/// On slice lengths that do not match the dimensions.
pub fn loss_from_stats(losses: &mut [f32], logits: &mut [f32], stats: &[f32], vocab: VocabSlice) {
    let n = losses.len();
    assert!(n > 0 && stats.len() % n == 0 && stats.len() / n >= 2);
    assert_eq!(logits.len(), n * vocab.width);
    let tp = stats.len() / n - 1;
    let real = vocab.real();
    losses
        .par_iter_mut()
        .zip(
            logits
                .par_chunks_mut(vocab.width)
                .zip(stats.par_chunks(tp + 1)),
        )
        .for_each(|(loss, (row, st))| {
            let lse = log_sum_exp(&st[..tp]);
            *loss = lse - st[tp];
            let (real_cols, pad) = row.split_at_mut(real);
            for x in real_cols {
                *x = math::exp(*x - lse);
            }
            pad.fill(0.0);
        });
}

/// log Σ e^x over the ranks' log-sum-exps, skipping −∞ (a rank with no real id).
fn log_sum_exp(xs: &[f32]) -> f32 {
    let max = xs.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f32 = xs
        .iter()
        .filter(|x| x.is_finite())
        .map(|&x| (x - max).exp())
        .sum();
    max + sum.ln()
}

/// The probabilities left by [`loss_from_stats`] turned into d(logits) in place:
/// `(probs[i,j] - [first + j == targets[i]]) * dlosses[i]` (the padding columns stay 0).
/// Overwrites, as the T = 1 cross-entropy backward.
///
/// # Panics
/// On slice lengths that do not match the dimensions.
pub fn loss_backward(probs: &mut [f32], dlosses: &[f32], targets: &[u32], vocab: VocabSlice) {
    assert_eq!(dlosses.len(), targets.len());
    assert_eq!(probs.len(), targets.len() * vocab.width);
    probs
        .par_chunks_mut(vocab.width)
        .zip(dlosses.par_iter().zip(targets.par_iter()))
        .for_each(|(row, (&dloss, &target))| {
            if let Some(i) = vocab.local(target) {
                row[i] -= 1.0;
            }
            for x in row.iter_mut() {
                *x *= dloss;
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::cross_entropy::{crossentropy_backward, crossentropy_forward};
    use crate::kernels::fd;

    /// Split `tp` ways, summed statistics give the whole cross-entropy's losses and
    /// gradients, a rank with padding only included (V = 5, Vp = 8, T = 4: rank 3 holds
    /// ids 6, 7).
    #[test]
    fn split_loss_matches_the_whole_loss() {
        let (n, v, vp, tp) = (3, 5, 8, 4);
        let logits = fd::random(n * vp, 5, 3.0);
        let targets = [4u32, 0, 2];
        let dlosses = [0.5f32, 1.0, 0.25];
        let (mut losses, mut whole) = (vec![0.0; n], logits.clone());
        crossentropy_forward(&mut losses, &mut whole, &targets, n, v, vp);
        crossentropy_backward(&mut whole, &dlosses, &targets, n, v, vp);
        let w = vp / tp;
        let part = |r: usize| -> Vec<f32> {
            (0..n)
                .flat_map(|i| logits[i * vp + r * w..i * vp + (r + 1) * w].to_vec())
                .collect()
        };
        let mut sum = vec![0.0f32; n * (tp + 1)];
        for r in 0..tp {
            let mut stats = vec![0.0; n * (tp + 1)];
            loss_stats(
                &mut stats,
                &part(r),
                &targets,
                VocabSlice::new(v, vp, tp, r),
                r,
                tp,
            );
            sum.iter_mut().zip(&stats).for_each(|(s, x)| *s += x);
        }
        for r in 0..tp {
            let vocab = VocabSlice::new(v, vp, tp, r);
            let (mut split_losses, mut probs) = (vec![0.0; n], part(r));
            loss_from_stats(&mut split_losses, &mut probs, &sum, vocab);
            loss_backward(&mut probs, &dlosses, &targets, vocab);
            for (a, b) in split_losses.iter().zip(&losses) {
                assert!((a - b).abs() < 1e-5, "rank {r}: loss {a} vs {b}");
            }
            for i in 0..n {
                for j in 0..w {
                    let (a, b) = (probs[i * w + j], whole[i * vp + r * w + j]);
                    assert!((a - b).abs() < 1e-6, "rank {r} ({i},{j}): {a} vs {b}");
                }
            }
        }
    }

    /// Summed over the ranks, the split embedding is the whole encoder, forward and
    /// backward.
    #[test]
    fn split_embedding_sums_to_the_whole_one() {
        let (b, s, c, v, vp, tp) = (2, 3, 4, 7, 8, 2);
        let tokens = [1u32, 6, 4, 0, 4, 3];
        let wte = fd::random(vp * c, 1, 1.0);
        let wpe = fd::random(s * c, 2, 1.0);
        let dout = fd::random(b * s * c, 3, 1.0);
        let mut whole = vec![0.0; b * s * c];
        crate::kernels::encoder::encoder_forward(&mut whole, &tokens, &wte, &wpe, b, s, c);
        let mut sum = vec![0.0f32; b * s * c];
        let w = vp / tp;
        for r in 0..tp {
            let vocab = VocabSlice::new(v, vp, tp, r);
            let wte_r = &wte[r * w * c..(r + 1) * w * c];
            let mut out = vec![0.0; b * s * c];
            embed_forward(
                &mut out,
                &tokens,
                wte_r,
                (r == 0).then_some(&wpe[..]),
                vocab,
                s,
                c,
            );
            sum.iter_mut().zip(&out).for_each(|(s, x)| *s += x);
            let (mut dwte, mut dwpe) = (vec![0.0; w * c], vec![0.0; s * c]);
            embed_backward(&mut dwte, &mut dwpe, &dout, &tokens, vocab, s, c);
            let (mut want_wte, mut want_wpe) = (vec![0.0; vp * c], vec![0.0; s * c]);
            crate::kernels::encoder::encoder_backward(
                &mut want_wte,
                &mut want_wpe,
                &dout,
                &tokens,
                b,
                s,
                c,
            );
            assert_eq!(dwte, want_wte[r * w * c..(r + 1) * w * c]);
            assert_eq!(dwpe, want_wpe);
        }
        for (a, b) in sum.iter().zip(&whole) {
            assert!((a - b).abs() < 1e-6);
        }
    }
}
