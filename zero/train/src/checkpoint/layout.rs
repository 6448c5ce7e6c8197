//! llm.c's file order of the GPT-2 parameters, derived from the model's own size table
//! ([`zero_gpt::ParamLayout`]): sizes, offsets and weight decay are never restated here.
//!
//! Dimension legend: L layers, NH heads, C channels, maxT context length, V vocabulary,
//! Vp padded vocabulary.
//!
//! The model keeps one flat buffer per unit (embeddings, one per block, final LayerNorm);
//! llm.c keeps each block tensor across all layers as one (L, ...) array. llm.c's file is
//! therefore: the embedding unit's tensors, then each block tensor for layers 0..L in turn,
//! then the final norm's tensors. Block tensors sit in the same order in both.

use serde::{Deserialize, Serialize};
use zero_gpt::{GptConfig, GptError, ParamLayout};

use super::error::{CheckpointError, LlmcFormatError, Result};

/// Model dimensions as llm.c's checkpoint header records them (its six words, its names).
///
/// Kept apart from [`GptConfig`] because it is what a file says before it is checked;
/// [`ModelShape::config`] is the model it describes once [`ModelShape::validate`] passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelShape {
    /// Context length (maxT).
    pub max_t: usize,
    /// Vocabulary size (V).
    pub vocab: usize,
    /// Padded vocabulary size (Vp >= V, a multiple of 128).
    pub padded_vocab: usize,
    /// Layers (L).
    pub layers: usize,
    /// Attention heads (NH).
    pub heads: usize,
    /// Channels (C).
    pub channels: usize,
}

/// One of llm.c's sixteen tensors and where its data lives in the unit buffers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LlmcTensor {
    /// llm.c's name (the model's name: the two agree).
    pub name: &'static str,
    /// Shape in llm.c's file: a block tensor has a leading L.
    pub shape: Vec<usize>,
    /// The unit holding it (the first block for a block tensor, which spans units 1..=L).
    pub unit: usize,
    /// First element inside that unit (the same in every block).
    pub offset: usize,
    /// Elements per unit (per layer for a block tensor).
    pub len: usize,
    /// Stored once per layer.
    pub per_layer: bool,
}

impl ModelShape {
    /// The header words for `config`.
    pub fn from_config(config: &GptConfig) -> Self {
        Self {
            max_t: config.max_seq_len,
            vocab: config.vocab_size,
            padded_vocab: config.padded_vocab_size,
            layers: config.num_layers,
            heads: config.num_heads,
            channels: config.channels,
        }
    }

    /// The model these words describe (check it with [`ModelShape::validate`]).
    pub fn config(&self) -> GptConfig {
        GptConfig {
            max_seq_len: self.max_t,
            vocab_size: self.vocab,
            padded_vocab_size: self.padded_vocab,
            num_layers: self.layers,
            num_heads: self.heads,
            channels: self.channels,
        }
    }

    /// Checks the model (the model's own rules) and that its byte count is addressable.
    ///
    /// # Errors
    /// [`LlmcFormatError::InvalidModel`] naming the field, or [`LlmcFormatError::SizeOverflow`].
    pub fn validate(&self) -> Result<(), LlmcFormatError> {
        self.config().validate().map_err(|e| match e {
            GptError::InvalidConfig {
                field,
                value,
                reason,
            } => LlmcFormatError::InvalidModel {
                field,
                value,
                reason,
            },
            _ => LlmcFormatError::SizeOverflow,
        })?;
        // An upper bound on the byte count, so the layout's unchecked sums cannot overflow:
        // every block tensor is at most 4C wide, so a block holds at most 16C^2 + 16C.
        let (c, l) = (self.channels, self.layers);
        let embeddings = self
            .padded_vocab
            .checked_add(self.max_t)
            .and_then(|x| x.checked_mul(c));
        let bound = c
            .checked_add(1)
            .and_then(|x| x.checked_mul(c)?.checked_mul(16)?.checked_mul(l))
            .and_then(|blocks| blocks.checked_add(embeddings?))
            .and_then(|b| b.checked_add(c.checked_mul(2)?))
            .and_then(|b| b.checked_mul(4));
        bound.map(|_| ()).ok_or(LlmcFormatError::SizeOverflow)
    }

    /// The model's size table (call [`ModelShape::validate`] first).
    pub fn layout(&self) -> ParamLayout {
        ParamLayout::new(&self.config())
    }

    /// Total parameters, padded vocabulary rows included (after [`ModelShape::validate`]).
    pub fn num_params(&self) -> usize {
        self.layout().num_params()
    }

    /// Elements in each unit's flat buffer.
    pub fn unit_sizes(&self) -> Vec<usize> {
        self.layout().unit_lens()
    }

    /// The sixteen tensors in llm.c's file order.
    pub fn llmc_tensors(&self) -> Vec<LlmcTensor> {
        let layout = self.layout();
        let units = layout.units();
        let (first, last) = (0, layout.final_norm_unit());
        let whole = |unit: usize| {
            units[unit].tensors.iter().map(move |t| LlmcTensor {
                name: t.name,
                shape: t.shape.clone(),
                unit,
                offset: t.offset,
                len: t.len,
                per_layer: false,
            })
        };
        let block = ParamLayout::block_unit(0);
        let per_layer = units[block].tensors.iter().map(|t| LlmcTensor {
            name: t.name,
            shape: std::iter::once(self.layers)
                .chain(t.shape.clone())
                .collect(),
            unit: block,
            offset: t.offset,
            len: t.len,
            per_layer: true,
        });
        whole(first).chain(per_layer).chain(whole(last)).collect()
    }

    /// Where unit `unit`'s tensors lie in the flat llm.c order: `(flat offset, range of the
    /// unit)` per tensor, so a writer can place one unit at a time.
    pub fn unit_pieces(&self, unit: usize) -> Vec<(usize, std::ops::Range<usize>)> {
        let mut pieces = Vec::new();
        let mut at = 0;
        for t in self.llmc_tensors() {
            let copies = if t.per_layer { self.layers } else { 1 };
            for layer in 0..copies {
                if t.unit + layer == unit {
                    pieces.push((at, t.offset..t.offset + t.len));
                }
                at += t.len;
            }
        }
        pieces
    }

    /// Validates, mapping a bad shape to an error without a file name.
    fn checked(&self) -> Result<()> {
        self.validate().map_err(|source| CheckpointError::Format {
            path: "<shape>".into(),
            source,
        })
    }

    /// Splits a flat buffer in llm.c order into per-unit buffers.
    ///
    /// # Errors
    /// [`CheckpointError::Format`] for an invalid shape, [`CheckpointError::ShapeMismatch`] if `flat` is not
    /// `num_params()` long.
    pub fn llmc_to_units(&self, flat: &[f32]) -> Result<Vec<Vec<f32>>> {
        self.checked()?;
        check_len("llm.c parameters", self.num_params(), flat.len())?;
        let mut units: Vec<Vec<f32>> = self
            .unit_sizes()
            .into_iter()
            .map(|n| vec![0.0; n])
            .collect();
        let mut at = 0;
        for t in self.llmc_tensors() {
            let copies = if t.per_layer { self.layers } else { 1 };
            for layer in 0..copies {
                units[t.unit + layer][t.offset..t.offset + t.len]
                    .copy_from_slice(&flat[at..at + t.len]);
                at += t.len;
            }
        }
        Ok(units)
    }

    /// Joins per-unit buffers into one flat buffer in llm.c order (inverse of
    /// [`ModelShape::llmc_to_units`]).
    ///
    /// # Errors
    /// [`CheckpointError::Format`] for an invalid shape, [`CheckpointError::ShapeMismatch`] if the unit count or
    /// a unit's length is wrong.
    pub fn units_to_llmc<U: AsRef<[f32]>>(&self, units: &[U]) -> Result<Vec<f32>> {
        self.checked()?;
        let sizes = self.unit_sizes();
        check_len("number of units", sizes.len(), units.len())?;
        for (u, (unit, size)) in units.iter().zip(&sizes).enumerate() {
            check_len(&format!("unit {u}"), *size, unit.as_ref().len())?;
        }
        let mut flat = Vec::with_capacity(self.num_params());
        for t in self.llmc_tensors() {
            let copies = if t.per_layer { self.layers } else { 1 };
            for layer in 0..copies {
                flat.extend_from_slice(&units[t.unit + layer].as_ref()[t.offset..t.offset + t.len]);
            }
        }
        Ok(flat)
    }
}

pub(crate) fn check_len(what: &str, expected: usize, got: usize) -> Result<()> {
    if expected == got {
        Ok(())
    } else {
        Err(CheckpointError::ShapeMismatch {
            what: what.to_string(),
            expected,
            got,
        })
    }
}
