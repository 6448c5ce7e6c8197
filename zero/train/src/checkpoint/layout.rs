//! The sixteen GPT-2 parameter tensors: shapes from a [`ModelShape`], their order in llm.c
//! files, and the per-unit layout the ZeRO engine shards.
//!
//! llm.c groups each tensor across layers (all layers' `ln1w` as one (L, C) block); the
//! engine wants one flat buffer per unit so that a unit can be gathered and released on its
//! own. Units: 0 = `wte` (Vp, C) then `wpe` (maxT, C); 1..=L = one transformer block each,
//! its twelve tensors in llm.c's order; L+1 = `lnfw` (C), `lnfb` (C).

use std::ops::Range;

use serde::{Deserialize, Serialize};

use super::error::{Error, FormatError, Result};
use zero::optim::DecaySegment;

/// llm.c's names of the parameter tensors, in file order.
pub const LLMC_TENSOR_NAMES: [&str; 16] = [
    "wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb", "ln2w", "ln2b", "fcw",
    "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb",
];

/// Index range in [`LLMC_TENSOR_NAMES`] of the tensors stored once per layer.
const LAYER_TENSORS: Range<usize> = 2..14;

/// Model dimensions as llm.c's checkpoint header records them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelShape {
    /// Context length (maxT).
    pub max_t: usize,
    /// Vocabulary size (V).
    pub vocab: usize,
    /// Padded vocabulary size (Vp >= V).
    pub padded_vocab: usize,
    /// Layers (L).
    pub layers: usize,
    /// Attention heads (NH).
    pub heads: usize,
    /// Channels (C).
    pub channels: usize,
}

/// One of the sixteen tensors, with its llm.c shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    /// llm.c's name.
    pub name: &'static str,
    /// Shape in llm.c's file, including the leading L of per-layer tensors.
    pub shape: Vec<usize>,
    /// Stored once per layer (shape starts with L).
    pub per_layer: bool,
    /// Takes weight decay (matrices and embeddings, not biases or LayerNorm).
    pub decay: bool,
}

impl TensorSpec {
    /// Elements in the whole tensor.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Elements per layer (the whole tensor when not per layer).
    pub fn layer_numel(&self) -> usize {
        if self.per_layer {
            self.shape[1..].iter().product()
        } else {
            self.numel()
        }
    }
}

/// A tensor's place inside a unit's flat buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitTensor {
    /// llm.c's name.
    pub name: &'static str,
    /// Element range within the unit.
    pub range: Range<usize>,
    /// Shape of this unit's part (without the layer dimension).
    pub shape: Vec<usize>,
    /// Takes weight decay.
    pub decay: bool,
}

fn bad_dim(field: &'static str, value: usize) -> FormatError {
    FormatError::BadDimension {
        field,
        value: value as i64,
    }
}

impl ModelShape {
    /// Checks the dimensions and that the total parameter count fits in memory addressing.
    ///
    /// # Errors
    /// [`FormatError::BadDimension`], [`FormatError::HeadsDoNotDivide`],
    /// [`FormatError::PaddedVocabTooSmall`] or [`FormatError::SizeOverflow`].
    pub fn validate(&self) -> Result<(), FormatError> {
        let dims = [
            ("max_t", self.max_t),
            ("vocab", self.vocab),
            ("padded_vocab", self.padded_vocab),
            ("layers", self.layers),
            ("heads", self.heads),
            ("channels", self.channels),
        ];
        for (field, value) in dims {
            if value == 0 {
                return Err(bad_dim(field, value));
            }
        }
        if self.channels % self.heads != 0 {
            return Err(FormatError::HeadsDoNotDivide {
                channels: self.channels,
                heads: self.heads,
            });
        }
        if self.padded_vocab < self.vocab {
            return Err(FormatError::PaddedVocabTooSmall {
                vocab: self.vocab,
                padded_vocab: self.padded_vocab,
            });
        }
        // Bytes must be addressable too (4 per f32).
        self.checked_num_params()
            .and_then(|n| n.checked_mul(4))
            .map(|_| ())
            .ok_or(FormatError::SizeOverflow)
    }

    fn checked_num_params(&self) -> Option<usize> {
        let (l, c) = (self.layers, self.channels);
        let embed = self.padded_vocab.checked_add(self.max_t)?.checked_mul(c)?;
        // Per block: 4C (two LayerNorms) + 3C*C + 3C + C*C + C + 4C*C + 4C + 4C*C + C = 12C^2 + 13C.
        let block = c
            .checked_mul(c)?
            .checked_mul(12)?
            .checked_add(c.checked_mul(13)?)?;
        embed
            .checked_add(block.checked_mul(l)?)?
            .checked_add(c.checked_mul(2)?)
    }

    /// Total parameters (call [`ModelShape::validate`] first; saturates on overflow).
    pub fn num_params(&self) -> usize {
        self.checked_num_params().unwrap_or(usize::MAX)
    }

    /// The sixteen tensors in llm.c's file order.
    pub fn tensors(&self) -> [TensorSpec; 16] {
        let (l, c, vp, t) = (self.layers, self.channels, self.padded_vocab, self.max_t);
        let spec = |name, shape: Vec<usize>, per_layer, decay| TensorSpec {
            name,
            shape,
            per_layer,
            decay,
        };
        [
            spec("wte", vec![vp, c], false, true),
            spec("wpe", vec![t, c], false, true),
            spec("ln1w", vec![l, c], true, false),
            spec("ln1b", vec![l, c], true, false),
            spec("qkvw", vec![l, 3 * c, c], true, true),
            spec("qkvb", vec![l, 3 * c], true, false),
            spec("attprojw", vec![l, c, c], true, true),
            spec("attprojb", vec![l, c], true, false),
            spec("ln2w", vec![l, c], true, false),
            spec("ln2b", vec![l, c], true, false),
            spec("fcw", vec![l, 4 * c, c], true, true),
            spec("fcb", vec![l, 4 * c], true, false),
            spec("fcprojw", vec![l, c, 4 * c], true, true),
            spec("fcprojb", vec![l, c], true, false),
            spec("lnfw", vec![c], false, false),
            spec("lnfb", vec![c], false, false),
        ]
    }

    /// Number of units: embeddings, one per layer, final LayerNorm.
    pub fn num_units(&self) -> usize {
        self.layers + 2
    }

    /// Indices into [`ModelShape::tensors`] of the tensors that make up `unit`.
    fn unit_tensor_indices(&self, unit: usize) -> Range<usize> {
        if unit == 0 {
            0..2
        } else if unit <= self.layers {
            LAYER_TENSORS
        } else {
            14..16
        }
    }

    /// The tensors of `unit` and their ranges in its flat buffer (`unit < num_units()`).
    pub fn unit_tensors(&self, unit: usize) -> Vec<UnitTensor> {
        let specs = self.tensors();
        let mut offset = 0;
        self.unit_tensor_indices(unit)
            .map(|i| {
                let s = &specs[i];
                let n = s.layer_numel();
                let shape = if s.per_layer {
                    s.shape[1..].to_vec()
                } else {
                    s.shape.clone()
                };
                let t = UnitTensor {
                    name: s.name,
                    range: offset..offset + n,
                    shape,
                    decay: s.decay,
                };
                offset += n;
                t
            })
            .collect()
    }

    /// Elements in each unit's flat buffer.
    pub fn unit_sizes(&self) -> Vec<usize> {
        (0..self.num_units())
            .map(|u| self.unit_tensors(u).last().map_or(0, |t| t.range.end))
            .collect()
    }

    /// The weight-decay segments of `unit`, for [`zero::optim::AdamW::update`].
    pub fn decay_segments(&self, unit: usize) -> Vec<DecaySegment> {
        self.unit_tensors(unit)
            .into_iter()
            .map(|t| DecaySegment {
                range: t.range,
                decay: t.decay,
            })
            .collect()
    }

    /// Splits a flat buffer in llm.c order into per-unit buffers.
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] if `flat` is not `num_params()` long.
    pub fn llmc_to_units(&self, flat: &[f32]) -> Result<Vec<Vec<f32>>> {
        self.validate().map_err(|source| Error::Format {
            path: "<shape>".into(),
            source,
        })?;
        check_len("llm.c parameters", self.num_params(), flat.len())?;
        let mut units: Vec<Vec<f32>> = self
            .unit_sizes()
            .into_iter()
            .map(Vec::with_capacity)
            .collect();
        let mut offset = 0;
        for (i, spec) in self.tensors().iter().enumerate() {
            let n = spec.layer_numel();
            if spec.per_layer {
                for layer in 0..self.layers {
                    units[1 + layer]
                        .extend_from_slice(&flat[offset + layer * n..offset + (layer + 1) * n]);
                }
            } else {
                let unit = if i < 2 { 0 } else { self.layers + 1 };
                units[unit].extend_from_slice(&flat[offset..offset + n]);
            }
            offset += spec.numel();
        }
        Ok(units)
    }

    /// Joins per-unit buffers into one flat buffer in llm.c order (inverse of
    /// [`ModelShape::llmc_to_units`]).
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] if the unit count or a unit's length is wrong.
    pub fn units_to_llmc<U: AsRef<[f32]>>(&self, units: &[U]) -> Result<Vec<f32>> {
        self.validate().map_err(|source| Error::Format {
            path: "<shape>".into(),
            source,
        })?;
        check_len("number of units", self.num_units(), units.len())?;
        for (u, (unit, size)) in units.iter().zip(self.unit_sizes()).enumerate() {
            check_len(&format!("unit {u}"), size, unit.as_ref().len())?;
        }
        let mut flat = Vec::with_capacity(self.num_params());
        // Offset of each tensor within its unit (the same for every layer).
        let mut in_unit = [0usize; 16];
        for u in [0, 1, self.layers + 1] {
            for (k, t) in self.unit_tensors(u).into_iter().enumerate() {
                in_unit[self.unit_tensor_indices(u).start + k] = t.range.start;
            }
        }
        for (i, spec) in self.tensors().iter().enumerate() {
            let n = spec.layer_numel();
            let start = in_unit[i];
            if spec.per_layer {
                for layer in 0..self.layers {
                    flat.extend_from_slice(&units[1 + layer].as_ref()[start..start + n]);
                }
            } else {
                let unit = if i < 2 { 0 } else { self.layers + 1 };
                flat.extend_from_slice(&units[unit].as_ref()[start..start + n]);
            }
        }
        Ok(flat)
    }
}

fn check_len(what: &str, expected: usize, got: usize) -> Result<()> {
    if expected == got {
        Ok(())
    } else {
        Err(Error::ShapeMismatch {
            what: what.to_string(),
            expected,
            got,
        })
    }
}
