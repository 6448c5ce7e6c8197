//! The checks every unit call makes first: buffer sizes, layer numbers, token ids, and the
//! call order recorded in the activations.

use super::Gpt;
use crate::activations::{Activations, Progress};
use crate::backend::Backend;
use crate::error::{GptError, Result};
use crate::layout::ParamLayout;

impl<B: Backend> Gpt<B> {
    /// Checks a `block_backward` call (buffer sizes, call order, recomputed segment);
    /// returns the block's unit.
    pub(super) fn check_block_backward(
        &self,
        acts: &Activations<B>,
        layer: usize,
        params_len: usize,
        grads_len: usize,
    ) -> Result<usize> {
        let unit = self.block_unit(layer)?;
        self.check_unit(unit, params_len, "block parameters")?;
        self.check_unit(unit, grads_len, "block gradients")?;
        self.check_call_order(acts, Progress::Backward { next: unit }, "block_backward")?;
        if acts.needs_recompute(layer) {
            return Err(GptError::OutOfOrder {
                call: "block_backward",
                reason: format!("block {layer}'s checkpointed segment was not recomputed"),
            });
        }
        Ok(unit)
    }

    /// Refuses activations sized for another model, then checks the call order.
    pub(super) fn check_call_order(
        &self,
        acts: &Activations<B>,
        want: Progress,
        call: &'static str,
    ) -> Result<()> {
        self.check_acts(acts)?;
        if acts.progress == want {
            return Ok(());
        }
        Err(GptError::OutOfOrder {
            call,
            reason: format!("expected state {want:?}, found {:?}", acts.progress),
        })
    }

    pub(super) fn check_acts(&self, acts: &Activations<B>) -> Result<()> {
        if acts.config != self.config {
            return Err(GptError::BadBatch {
                batch: acts.b,
                seq_len: acts.t,
                reason: "activations were sized for a different model config",
            });
        }
        if acts.tp != self.split.size || acts.vocab_parallel != self.layout.vocab_parallel() {
            return Err(GptError::BadBatch {
                batch: acts.b,
                seq_len: acts.t,
                reason: "activations were sized for a different tensor-parallel split",
            });
        }
        Ok(())
    }

    pub(super) fn block_unit(&self, layer: usize) -> Result<usize> {
        self.check_layer(layer)?;
        if self.split.size > 1 {
            return Err(GptError::OutOfOrder {
                call: "a whole-block call",
                reason: "split over a tensor-parallel group, a block runs as its split calls \
                         (Gpt::tp_attention_forward and the rest)"
                    .into(),
            });
        }
        Ok(ParamLayout::block_unit(layer))
    }

    /// Refuses a whole-embedding or whole-head call (`call`) when the vocabulary is split.
    pub(super) fn check_whole_vocab(&self, call: &'static str) -> Result<()> {
        if self.layout.vocab_parallel() {
            return Err(GptError::OutOfOrder {
                call,
                reason: "the vocabulary is split over a tensor-parallel group: run \
                         Gpt::tp_embed_forward, Gpt::tp_head_forward and the rest"
                    .into(),
            });
        }
        Ok(())
    }

    /// Refuses a layer past L.
    pub(super) fn check_layer(&self, layer: usize) -> Result<()> {
        if layer >= self.config.num_layers {
            return Err(GptError::NoSuchLayer {
                layer,
                num_layers: self.config.num_layers,
            });
        }
        Ok(())
    }

    pub(super) fn check_unit(&self, unit: usize, got: usize, what: &'static str) -> Result<()> {
        let expected = self.layout.units()[unit].len;
        if got != expected {
            return Err(GptError::SizeMismatch {
                what,
                expected,
                got,
            });
        }
        Ok(())
    }

    pub(super) fn check_num_units(&self, got: usize, what: &'static str) -> Result<()> {
        let expected = self.layout.num_units();
        if got != expected {
            return Err(GptError::SizeMismatch {
                what,
                expected,
                got,
            });
        }
        Ok(())
    }
}

pub(super) fn check_ids(
    what: &'static str,
    ids: &[u32],
    n: usize,
    vocab_size: usize,
) -> Result<()> {
    if ids.len() != n {
        return Err(GptError::SizeMismatch {
            what,
            expected: n,
            got: ids.len(),
        });
    }
    match ids.iter().position(|&id| id as usize >= vocab_size) {
        Some(index) => Err(GptError::TokenOutOfRange {
            what,
            index,
            id: ids[index],
            vocab_size,
        }),
        None => Ok(()),
    }
}
