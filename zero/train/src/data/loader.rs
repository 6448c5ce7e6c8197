//! Per-rank batch loading with results that do not depend on the number of ranks.
//!
//! The token stream is cut into *windows* of `G + 1` tokens, `G = B * T * world * accum`
//! (one global batch plus the one-token shift of the targets); window `k` starts at token
//! `k * G`, as llm.c's loader advances. A window holds `B * world * accum` sequences of `T`
//! tokens; micro-step `s` of rank `r` takes the `B` sequences starting at sequence
//! `(s * world + r) * B`. So a global batch is the same set of sequences whatever `world`
//! is, and with `world = 1, accum = W * A` micro-step `s * W + r` sees exactly what rank `r`
//! saw at micro-step `s`. Tokens past the last whole window are skipped and the loader
//! wraps to the next epoch. With `shuffle`, each epoch visits the windows in an order drawn
//! from `(seed, epoch)`; the order is a pure function of those, so every rank agrees on it
//! without talking, and the state to save is just the step counter.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::error::{DataError, Result};
use super::token_file::TokenFile;

/// Shape of the batches and this rank's place among the data-parallel ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoaderConfig {
    /// Sequences per micro-batch per rank (B).
    pub micro_batch: usize,
    /// Tokens per sequence (T).
    pub seq_len: usize,
    /// This rank.
    pub rank: usize,
    /// Number of data-parallel ranks.
    pub world_size: usize,
    /// Micro-steps per global batch (gradient accumulation).
    pub grad_accum_steps: usize,
    /// Seed of the window order when `shuffle` is on.
    pub seed: u64,
    /// Visit windows in a seeded random order per epoch instead of file order.
    pub shuffle: bool,
}

/// Where a loader stands; serialise it into a checkpoint to resume exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoaderState {
    /// Global batches fully handed out so far (across epochs).
    pub global_step: u64,
    /// Micro-steps of the current global batch already handed out.
    pub micro_step: u64,
    /// Tokens in the file the state was taken on (a guard against resuming on other data).
    pub file_tokens: u64,
    /// Tokens per global batch when the state was taken.
    pub global_batch_tokens: u64,
    /// Seed when the state was taken.
    pub seed: u64,
    /// Shuffle flag when the state was taken.
    pub shuffle: bool,
}

/// Yields this rank's micro-batches of every global batch; see the module docs.
#[derive(Debug)]
pub struct DataLoader {
    file: Arc<TokenFile>,
    cfg: LoaderConfig,
    /// Tokens per global batch (G).
    global_tokens: usize,
    windows_per_epoch: u64,
    global_step: u64,
    micro_step: u64,
    /// Window order of one epoch, cached: `(epoch, order)`.
    order: Option<(u64, Vec<u64>)>,
}

fn invalid(reason: impl Into<String>) -> DataError {
    DataError::InvalidConfig {
        reason: reason.into(),
    }
}

impl DataLoader {
    /// A loader over `file` positioned at the first global batch.
    ///
    /// # Errors
    /// [`DataError::InvalidConfig`] for zero sizes, `rank >= world_size` or sizes that overflow;
    /// [`DataError::NotEnoughTokens`] if the file cannot fill one global batch.
    pub fn new(file: Arc<TokenFile>, cfg: LoaderConfig) -> Result<Self> {
        if cfg.micro_batch == 0
            || cfg.seq_len == 0
            || cfg.world_size == 0
            || cfg.grad_accum_steps == 0
        {
            return Err(invalid(format!(
                "B={}, T={}, world_size={}, grad_accum_steps={} must all be positive",
                cfg.micro_batch, cfg.seq_len, cfg.world_size, cfg.grad_accum_steps
            )));
        }
        if cfg.rank >= cfg.world_size {
            return Err(invalid(format!(
                "rank {} is not below world_size {}",
                cfg.rank, cfg.world_size
            )));
        }
        let global_tokens = cfg
            .micro_batch
            .checked_mul(cfg.seq_len)
            .and_then(|x| x.checked_mul(cfg.world_size))
            .and_then(|x| x.checked_mul(cfg.grad_accum_steps))
            .ok_or_else(|| invalid("B * T * world_size * grad_accum_steps overflows"))?;
        let available = file.len();
        if available < global_tokens.saturating_add(1) {
            return Err(DataError::NotEnoughTokens {
                needed: global_tokens as u64 + 1,
                available: available as u64,
            });
        }
        let windows_per_epoch = ((available - 1) / global_tokens) as u64;
        Ok(Self {
            file,
            cfg,
            global_tokens,
            windows_per_epoch,
            global_step: 0,
            micro_step: 0,
            order: None,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &LoaderConfig {
        &self.cfg
    }

    /// Tokens per micro-batch of this rank (B * T): the length of each output buffer.
    pub fn micro_batch_tokens(&self) -> usize {
        self.cfg.micro_batch * self.cfg.seq_len
    }

    /// Tokens per global batch (B * T * world * accum).
    pub fn global_batch_tokens(&self) -> usize {
        self.global_tokens
    }

    /// Whole global batches per pass over the file.
    pub fn batches_per_epoch(&self) -> u64 {
        self.windows_per_epoch
    }

    /// The epoch of the next micro-batch.
    pub fn epoch(&self) -> u64 {
        self.global_step / self.windows_per_epoch
    }

    /// Hands out this rank's next micro-batch: `inputs` and `targets` (targets are inputs
    /// shifted by one token), each `B * T` long, row-major (B, T).
    ///
    /// # Errors
    /// [`DataError::BufferSize`] if a buffer is not `B * T` long.
    pub fn next_micro_batch(&mut self, inputs: &mut [u32], targets: &mut [u32]) -> Result<()> {
        self.micro_batch_at(self.global_step, self.micro_step, inputs, targets)?;
        self.micro_step += 1;
        if self.micro_step == self.cfg.grad_accum_steps as u64 {
            self.micro_step = 0;
            self.global_step += 1;
        }
        Ok(())
    }

    /// This rank's micro-batch `micro_step` of global batch `global_step`, without moving.
    ///
    /// # Errors
    /// [`DataError::BufferSize`] for buffers that are not `B * T` long;
    /// [`DataError::InvalidConfig`] if `micro_step >= grad_accum_steps`.
    pub fn micro_batch_at(
        &mut self,
        global_step: u64,
        micro_step: u64,
        inputs: &mut [u32],
        targets: &mut [u32],
    ) -> Result<()> {
        let n = self.micro_batch_tokens();
        for len in [inputs.len(), targets.len()] {
            if len != n {
                return Err(DataError::BufferSize {
                    expected: n,
                    got: len,
                });
            }
        }
        if micro_step >= self.cfg.grad_accum_steps as u64 {
            return Err(invalid(format!(
                "micro_step {micro_step} is not below grad_accum_steps {}",
                self.cfg.grad_accum_steps
            )));
        }
        let window = self.window_of(global_step);
        // window < windows_per_epoch, so start + n + 1 <= len (checked in `new`).
        let seq =
            (micro_step as usize * self.cfg.world_size + self.cfg.rank) * self.cfg.micro_batch;
        let start = window as usize * self.global_tokens + seq * self.cfg.seq_len;
        let tokens = &self.file.tokens()[start..start + n + 1];
        for (i, (x, y)) in inputs.iter_mut().zip(targets.iter_mut()).enumerate() {
            *x = u32::from(tokens[i]);
            *y = u32::from(tokens[i + 1]);
        }
        Ok(())
    }

    /// The window that global batch `global_step` reads.
    fn window_of(&mut self, global_step: u64) -> u64 {
        let epoch = global_step / self.windows_per_epoch;
        let index = global_step % self.windows_per_epoch;
        if !self.cfg.shuffle {
            return index;
        }
        if self.order.as_ref().map(|(e, _)| *e) != Some(epoch) {
            self.order = Some((
                epoch,
                epoch_order(self.windows_per_epoch, self.cfg.seed, epoch),
            ));
        }
        match &self.order {
            Some((_, order)) => order[index as usize],
            None => index,
        }
    }

    /// The position to save for resuming.
    pub fn state(&self) -> LoaderState {
        LoaderState {
            global_step: self.global_step,
            micro_step: self.micro_step,
            file_tokens: self.file.len() as u64,
            global_batch_tokens: self.global_tokens as u64,
            seed: self.cfg.seed,
            shuffle: self.cfg.shuffle,
        }
    }

    /// Moves to a saved position. The rank count may differ from when it was saved (the
    /// global batch is what matters), but the data, global batch size, seed and shuffle
    /// flag must match.
    ///
    /// # Errors
    /// [`DataError::StateMismatch`] naming the first field that differs.
    pub fn restore(&mut self, state: &LoaderState) -> Result<()> {
        let mine = self.state();
        let checks = [
            ("file_tokens", state.file_tokens, mine.file_tokens),
            (
                "global_batch_tokens",
                state.global_batch_tokens,
                mine.global_batch_tokens,
            ),
            ("seed", state.seed, mine.seed),
            ("shuffle", u64::from(state.shuffle), u64::from(mine.shuffle)),
        ];
        for (field, saved, current) in checks {
            if saved != current {
                return Err(DataError::StateMismatch {
                    reason: format!(
                        "{field}: saved {saved}, current {current}{}",
                        hint(field, saved, self.cfg.seq_len)
                    ),
                });
            }
        }
        if state.micro_step >= self.cfg.grad_accum_steps as u64 {
            return Err(DataError::StateMismatch {
                reason: format!(
                    "micro_step {} is not below grad_accum_steps {}",
                    state.micro_step, self.cfg.grad_accum_steps
                ),
            });
        }
        self.global_step = state.global_step;
        self.micro_step = state.micro_step;
        Ok(())
    }
}

/// What to type for a mismatch the user can fix by a flag: the saved run's global batch in
/// sequences (its data order depends on it, whatever the world size), or its seed.
fn hint(field: &str, saved: u64, seq_len: usize) -> String {
    let seq_len = seq_len.max(1) as u64;
    match field {
        "global_batch_tokens" if saved % seq_len == 0 => {
            let batch = saved / seq_len;
            format!(" (resume with --batch-size {batch}, and a --micro-batch-size x ranks that divides it)")
        }
        "seed" => format!(" (resume with --seed {saved})"),
        _ => String::new(),
    }
}

/// SplitMix64: a tiny, well-mixed generator; enough to shuffle window order reproducibly
/// without a `rand` dependency whose streams could change between versions.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Fisher-Yates permutation of `0..n` drawn from `(seed, epoch)`.
fn epoch_order(n: u64, seed: u64, epoch: u64) -> Vec<u64> {
    let mut state = seed ^ epoch.wrapping_mul(0xD6E8_FEB8_6659_FD93);
    let mut order: Vec<u64> = (0..n).collect();
    for i in (1..order.len()).rev() {
        // Modulo bias is below 2^-40 for any realistic window count; irrelevant here.
        let j = (splitmix64(&mut state) % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epoch_order_is_a_permutation_that_changes_with_epoch() {
        let a = epoch_order(50, 7, 0);
        let b = epoch_order(50, 7, 1);
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..50).collect::<Vec<_>>());
        assert_ne!(a, b);
        assert_eq!(a, epoch_order(50, 7, 0));
    }
}
