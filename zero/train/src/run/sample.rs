//! The closing sample: seeded top-k generation after `<|endoftext|>`, and its GPT-2 text.

use crate::bridge::{logits_at, Placement};
use crate::error::TrainError;
use zero::Engine;
use zero_gpt::{sample_top_k, Gpt, Rng};

/// GPT-2's end-of-text token, the prompt of the closing sample.
const END_OF_TEXT: u32 = 50256;

/// Generates `tokens` tokens after `<|endoftext|>` (token 0 when the vocabulary is smaller)
/// with top-k sampling seeded by `seed`, in windows of `t` positions. Every rank computes
/// the same tokens (same parameters, same seed), so stage 3's gathers stay in step without
/// a broadcast.
///
/// # Errors
/// Engine or model errors of the forward passes.
pub(crate) fn sample<B: Placement>(
    engine: &mut Engine,
    model: &Gpt<B>,
    t: usize,
    tokens: usize,
    top_k: usize,
    seed: u64,
) -> Result<Vec<u32>, TrainError> {
    let config = model.config();
    let start = if (END_OF_TEXT as usize) < config.vocab_size {
        END_OF_TEXT
    } else {
        0
    };
    let mut rng = Rng::new(seed ^ 0x5eed);
    let mut acts = model.activations(1, t)?;
    let mut out = vec![start];
    for _ in 0..tokens {
        // The context is the last t tokens, padded on the right: causal attention keeps the
        // padding from touching the positions that are read.
        let ctx = &out[out.len().saturating_sub(t)..];
        let pos = ctx.len() - 1;
        let mut window = vec![0u32; t];
        window[..ctx.len()].copy_from_slice(ctx);
        let logits = logits_at(engine, model, &mut acts, &window, pos)?;
        let next = sample_top_k(&logits, config.vocab_size, top_k, 1.0, &mut rng);
        match next {
            Some(tok) => out.push(tok),
            None => break,
        }
    }
    Ok(out[1..].to_vec())
}

/// GPT-2 text of `tokens` (lossy where a token is not valid UTF-8 on its own; the ids
/// themselves when the tokenizer is unavailable).
pub(crate) fn decode(tokens: &[u32]) -> String {
    match tiktoken_rs::r50k_base() {
        Ok(bpe) => bpe.decode(tokens).unwrap_or_else(|_| format!("{tokens:?}")),
        Err(_) => format!("{tokens:?}"),
    }
}
