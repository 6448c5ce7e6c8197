//! Top-k sampling from one position's logits.
//!
//! Legend: V vocabulary, Vp padded vocabulary.

use super::init::Rng;

/// Draws a token id from the `k` most likely of the first `vocab_size` logits (the padded
/// columns are never candidates), softmax at `temperature`. Ties keep the lower id first, so
/// the draw is a pure function of (logits, k, temperature, RNG state).
///
/// `k` is clamped to 1..=V; a non-positive or non-finite temperature means greedy (argmax).
/// Returns `None` only for an empty vocabulary or when no logit is finite.
pub fn sample_top_k(
    logits: &[f32],
    vocab_size: usize,
    k: usize,
    temperature: f32,
    rng: &mut Rng,
) -> Option<u32> {
    let real = &logits[..vocab_size.min(logits.len())];
    let mut ids: Vec<u32> = (0..real.len())
        .filter(|&i| real[i].is_finite())
        .filter_map(|i| u32::try_from(i).ok())
        .collect();
    if ids.is_empty() {
        return None;
    }
    let k = k.clamp(1, ids.len());
    // Descending by logit, ascending id on ties (total order: NaNs were filtered out).
    ids.sort_by(|&a, &b| {
        real[b as usize]
            .total_cmp(&real[a as usize])
            .then(a.cmp(&b))
    });
    ids.truncate(k);
    if !(temperature.is_finite() && temperature > 0.0) {
        return ids.first().copied();
    }
    let top = f64::from(real[ids[0] as usize]);
    let weights: Vec<f64> = ids
        .iter()
        .map(|&i| ((f64::from(real[i as usize]) - top) / f64::from(temperature)).exp())
        .collect();
    let mut r = rng.uniform() * weights.iter().sum::<f64>();
    for (&id, &w) in ids.iter().zip(&weights) {
        if r < w {
            return Some(id);
        }
        r -= w;
    }
    ids.last().copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_one_is_argmax_and_padding_is_never_drawn() {
        let mut logits = vec![0.0f32; 8];
        logits[2] = 5.0;
        logits[6] = 100.0; // padded column (vocab_size = 5)
        let mut rng = Rng::new(1);
        assert_eq!(sample_top_k(&logits, 5, 1, 1.0, &mut rng), Some(2));
        for _ in 0..100 {
            assert!(sample_top_k(&logits, 5, 8, 1.0, &mut rng).is_some_and(|id| id < 5));
        }
    }

    #[test]
    fn draws_only_from_the_top_k() {
        let logits = [1.0f32, 4.0, 3.0, 2.0, 0.0];
        let mut rng = Rng::new(9);
        let mut seen = [0usize; 5];
        for _ in 0..500 {
            seen[sample_top_k(&logits, 5, 2, 1.0, &mut rng).unwrap() as usize] += 1;
        }
        assert_eq!(seen[0] + seen[3] + seen[4], 0);
        // p(1) = e^4 / (e^4 + e^3) = 0.73
        assert!((300..430).contains(&seen[1]), "{seen:?}");
    }

    #[test]
    fn empty_or_non_finite_logits_give_none() {
        let mut rng = Rng::new(0);
        assert_eq!(sample_top_k(&[], 0, 3, 1.0, &mut rng), None);
        assert_eq!(sample_top_k(&[f32::NAN], 1, 3, 1.0, &mut rng), None);
    }
}
