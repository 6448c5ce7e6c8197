//! The parameter size table: units, their named tensors, shapes and offsets.
//!
//! Legend: C channels, L layers, Vp padded vocabulary, maxT = `max_seq_len`.
//!
//! Parameters live in UNITS, each one flat buffer owned by the caller (the ZeRO engine keeps
//! them in an arena, or gathers them on demand at stage 3):
//! - unit 0: embeddings, `wte` (Vp, C) then `wpe` (maxT, C);
//! - units 1..=L: one transformer block each (12 tensors, the same table for every block);
//! - unit L+1: the final LayerNorm, `lnfw` (C), `lnfb` (C).
//!
//! Split over a tensor-parallel group of T > 1 ranks ([`ParamLayout::split`]), block `l` is
//! three units: `1 + 3l` its attention slice (this rank's part of qkvw, qkvb, attprojw),
//! `2 + 3l` its MLP slice (its part of fcw, fcb, fcprojw; see `split`) and `3 + 3l` its
//! replicated tensors (ln1w, ln1b, attprojb, ln2w, ln2b, fcprojb), and the final LayerNorm
//! is unit 3L+1. With the vocabulary split too ([`ParamLayout::split_vocab`]), unit 0 holds
//! this rank's Vp/T rows of `wte` alone, `wpe` (replicated) is unit 3L+1 and the final
//! LayerNorm unit 3L+2.
//!
//! Why two slice units per block rather than one: ZeRO stage 3 gathers a whole unit for the
//! calls that read it, so the largest unit sets the transient gathered bytes. Each split call
//! reads one of the two halves only (the attention calls the attention slice, the MLP calls
//! the MLP slice; see `tp_program`), so at stage 3 a step holds the larger of the two
//! gathered (the MLP's, 8C²/T against 4C²/T), not the block's 12C²/T. Every T > 1 uses these
//! units, one layout: the finer units cost a few more (small) collectives and nothing else.
//!
//! Gradients use the same table: a unit's gradient buffer has the unit's length and the same
//! offsets. Sizes are element counts, not bytes, so the table serves any dtype.

use super::config::GptConfig;
use super::split::{attention_slice_specs, mlp_slice_specs, replicated_specs};

/// One named tensor inside a unit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    /// llm.c's name (`wte`, `qkvw`, ...).
    pub name: &'static str,
    /// Row-major shape; matrices are (out, in).
    pub shape: Vec<usize>,
    /// First element inside the unit's buffer.
    pub offset: usize,
    /// Number of elements (product of `shape`).
    pub len: usize,
    /// Whether AdamW's weight decay applies (see [`decays`]).
    pub weight_decay: bool,
}

/// What a unit holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnitKind {
    /// Token and position embeddings (unit 0). The token embedding is also the LM head.
    Embedding,
    /// Transformer block `layer` (unit `layer + 1`).
    Block {
        /// Layer index in `0..L`.
        layer: usize,
    },
    /// The final LayerNorm (unit L+1; split, 3L+1, or 3L+2 with the vocabulary split).
    FinalNorm,
    /// Split over T > 1 ranks: this rank's slice of block `layer`'s attention, qkvw, qkvb,
    /// attprojw (unit `1 + 3 * layer`).
    AttentionSlice {
        /// Layer index in `0..L`.
        layer: usize,
    },
    /// Split over T > 1 ranks: this rank's slice of block `layer`'s MLP, fcw, fcb, fcprojw
    /// (unit `2 + 3 * layer`).
    MlpSlice {
        /// Layer index in `0..L`.
        layer: usize,
    },
    /// Split over T > 1 ranks: block `layer`'s replicated tensors (unit `3 + 3 * layer`).
    BlockReplicated {
        /// Layer index in `0..L`.
        layer: usize,
    },
    /// Vocabulary split over T > 1 ranks: this rank's Vp/T rows of `wte` (unit 0).
    EmbeddingSlice,
    /// Vocabulary split over T > 1 ranks: `wpe`, replicated (unit 3L+1).
    Positions,
}

impl UnitKind {
    /// True for a rank's slice of a split tensor (a block's attention or MLP slice, the
    /// embedding's rows), whose values differ by tensor-parallel rank; every other unit is
    /// the same on every rank of a group.
    #[must_use]
    pub fn is_slice(self) -> bool {
        matches!(
            self,
            Self::AttentionSlice { .. } | Self::MlpSlice { .. } | Self::EmbeddingSlice
        )
    }
}

/// One unit's table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitLayout {
    /// What the unit is.
    pub kind: UnitKind,
    /// Its tensors, in buffer order, contiguous from offset 0.
    pub tensors: Vec<TensorSpec>,
    /// Elements in the unit's flat buffer.
    pub len: usize,
}

impl UnitLayout {
    fn new(kind: UnitKind, specs: Vec<(&'static str, Vec<usize>)>) -> Self {
        let mut offset = 0;
        let tensors = specs
            .into_iter()
            .map(|(name, shape)| {
                let len = shape.iter().product();
                let spec = TensorSpec {
                    name,
                    weight_decay: decays(name),
                    shape,
                    offset,
                    len,
                };
                offset += len;
                spec
            })
            .collect();
        Self {
            kind,
            tensors,
            len: offset,
        }
    }

    /// The tensor called `name`, if the unit has one.
    #[must_use]
    pub fn tensor(&self, name: &str) -> Option<&TensorSpec> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// Element counts in buffer order (what the model carves a unit buffer by).
    pub(crate) fn lens<const K: usize>(&self) -> [usize; K] {
        debug_assert_eq!(self.tensors.len(), K);
        std::array::from_fn(|i| self.tensors[i].len)
    }
}

/// Whether a tensor gets weight decay.
///
/// Decision: matrices decay, including `wte` (a matrix, and as the tied LM head the largest
/// projection of the model; GPT-2, llm.c and nanoGPT decay it too); biases, LayerNorm weights
/// and biases, and the position embedding `wpe` do not (minGPT's rule). The rejected
/// alternative, "every 2-D tensor", would decay `wpe` as nanoGPT does.
#[must_use]
pub fn decays(name: &str) -> bool {
    matches!(name, "wte" | "qkvw" | "attprojw" | "fcw" | "fcprojw")
}

/// The block's tensors, in buffer order, with their shapes.
fn block_specs(c: usize) -> Vec<(&'static str, Vec<usize>)> {
    vec![
        ("ln1w", vec![c]),
        ("ln1b", vec![c]),
        ("qkvw", vec![3 * c, c]),
        ("qkvb", vec![3 * c]),
        ("attprojw", vec![c, c]),
        ("attprojb", vec![c]),
        ("ln2w", vec![c]),
        ("ln2b", vec![c]),
        ("fcw", vec![4 * c, c]),
        ("fcb", vec![4 * c]),
        ("fcprojw", vec![c, 4 * c]),
        ("fcprojb", vec![c]),
    ]
}

/// Units per block split over T > 1 ranks: attention slice, MLP slice, replicated.
const SPLIT_UNITS_PER_BLOCK: usize = 3;

/// The size table of a whole model: one [`UnitLayout`] per unit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamLayout {
    units: Vec<UnitLayout>,
    /// T, the tensor-parallel size the blocks are split for (1: whole blocks).
    tensor_parallel: usize,
}

impl ParamLayout {
    /// The table for `config` (assumed validated).
    #[must_use]
    pub fn new(config: &GptConfig) -> Self {
        let c = config.channels;
        let mut units = Vec::with_capacity(config.num_layers + 2);
        units.push(UnitLayout::new(
            UnitKind::Embedding,
            vec![
                ("wte", vec![config.padded_vocab_size, c]),
                ("wpe", vec![config.max_seq_len, c]),
            ],
        ));
        for layer in 0..config.num_layers {
            units.push(UnitLayout::new(UnitKind::Block { layer }, block_specs(c)));
        }
        units.push(UnitLayout::new(
            UnitKind::FinalNorm,
            vec![("lnfw", vec![c]), ("lnfb", vec![c])],
        ));
        Self {
            units,
            tensor_parallel: 1,
        }
    }

    /// The table of one rank of a tensor-parallel group of `tp` ranks: at `tp` = 1
    /// [`ParamLayout::new`]'s, above it each block as three units, its attention slice, its
    /// MLP slice, then its replicated tensors (see the module doc). `tp` must have passed
    /// [`TpSplit::validate`](crate::TpSplit::validate).
    #[must_use]
    pub fn split(config: &GptConfig, tp: usize) -> Self {
        let mut layout = Self::new(config);
        if tp <= 1 {
            return layout;
        }
        let c = config.channels;
        let final_norm = layout.units.pop();
        layout.units.truncate(1);
        for layer in 0..config.num_layers {
            layout.units.extend([
                UnitLayout::new(
                    UnitKind::AttentionSlice { layer },
                    attention_slice_specs(c, tp),
                ),
                UnitLayout::new(UnitKind::MlpSlice { layer }, mlp_slice_specs(c, tp)),
                UnitLayout::new(UnitKind::BlockReplicated { layer }, replicated_specs(c)),
            ]);
        }
        layout.units.extend(final_norm);
        layout.tensor_parallel = tp;
        layout
    }

    /// The table of one rank of a tensor-parallel group of `tp` > 1 ranks that splits the
    /// vocabulary too: [`ParamLayout::split`]'s, with unit 0 only this rank's Vp/T rows of
    /// `wte` and `wpe` a unit of its own, 3L+1, before the final LayerNorm (3L+2). `tp` must
    /// divide NH and Vp; at `tp` = 1 [`ParamLayout::new`]'s.
    #[must_use]
    pub fn split_vocab(config: &GptConfig, tp: usize) -> Self {
        let mut layout = Self::split(config, tp);
        if tp <= 1 {
            return layout;
        }
        let (c, vp) = (config.channels, config.padded_vocab_size);
        let slice = vec![("wte", vec![vp / tp, c])];
        layout.units[0] = UnitLayout::new(UnitKind::EmbeddingSlice, slice);
        let positions = vec![("wpe", vec![config.max_seq_len, c])];
        let at = layout.units.len() - 1;
        layout
            .units
            .insert(at, UnitLayout::new(UnitKind::Positions, positions));
        layout
    }

    /// T, the tensor-parallel size the blocks are split for (1: whole blocks).
    #[must_use]
    pub fn tensor_parallel(&self) -> usize {
        self.tensor_parallel
    }

    /// True when unit 0 holds a slice of the vocabulary ([`ParamLayout::split_vocab`]).
    #[must_use]
    pub fn vocab_parallel(&self) -> bool {
        self.units[0].kind == UnitKind::EmbeddingSlice
    }

    /// The unit of `wpe` when the vocabulary is split ([`ParamLayout::split_vocab`]), else
    /// `None` (it is in unit 0).
    #[must_use]
    pub fn positions_unit(&self) -> Option<usize> {
        self.units
            .iter()
            .position(|u| u.kind == UnitKind::Positions)
    }

    /// L.
    #[must_use]
    pub fn num_layers(&self) -> usize {
        let block = |u: &&UnitLayout| {
            matches!(
                u.kind,
                UnitKind::Block { .. } | UnitKind::AttentionSlice { .. }
            )
        };
        self.units.iter().filter(block).count()
    }

    /// The units holding block `layer`'s parameters: `[layer + 1]`, or split over T > 1
    /// ranks its attention slice, its MLP slice and its replicated unit.
    #[must_use]
    pub fn block_units(&self, layer: usize) -> Vec<usize> {
        match self.tensor_parallel {
            1 => vec![Self::block_unit(layer)],
            _ => Self::split_block_units(layer).to_vec(),
        }
    }

    /// Split over T > 1 ranks: block `layer`'s units, (attention slice, MLP slice,
    /// replicated), consecutive.
    #[must_use]
    pub fn split_block_units(layer: usize) -> [usize; 3] {
        let first = 1 + SPLIT_UNITS_PER_BLOCK * layer;
        [first, first + 1, first + 2]
    }

    /// Split over T > 1 ranks: the unit of block `layer`'s attention slice.
    #[must_use]
    pub fn attention_slice_unit(layer: usize) -> usize {
        Self::split_block_units(layer)[0]
    }

    /// Split over T > 1 ranks: the unit of block `layer`'s MLP slice.
    #[must_use]
    pub fn mlp_slice_unit(layer: usize) -> usize {
        Self::split_block_units(layer)[1]
    }

    /// Split over T > 1 ranks: the unit of block `layer`'s replicated tensors.
    #[must_use]
    pub fn replicated_unit(layer: usize) -> usize {
        Self::split_block_units(layer)[2]
    }

    /// All units, in order: embedding, blocks 0..L, final norm (split: see the module doc).
    #[must_use]
    pub fn units(&self) -> &[UnitLayout] {
        &self.units
    }

    /// Number of units (L + 2; split, 3L + 2, or 3L + 3 with the vocabulary split).
    #[must_use]
    pub fn num_units(&self) -> usize {
        self.units.len()
    }

    /// Elements of every unit, in order: what to allocate for parameters (and gradients).
    #[must_use]
    pub fn unit_lens(&self) -> Vec<usize> {
        self.units.iter().map(|u| u.len).collect()
    }

    /// Total parameter count, padded vocabulary rows included.
    #[must_use]
    pub fn num_params(&self) -> usize {
        self.units.iter().map(|u| u.len).sum()
    }

    /// Unit index of block `layer` (whole blocks, T = 1).
    #[must_use]
    pub fn block_unit(layer: usize) -> usize {
        layer + 1
    }

    /// Unit index of the final LayerNorm.
    #[must_use]
    pub fn final_norm_unit(&self) -> usize {
        self.units.len() - 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpt2_has_124m_parameters() {
        let layout = ParamLayout::new(&GptConfig::gpt2());
        // 124,475,904 with the padded vocabulary (llm.c prints the same figure).
        assert_eq!(layout.num_params(), 124_475_904);
        assert_eq!(layout.num_units(), 14);
    }

    #[test]
    fn preset_parameter_counts_match_the_closed_form() {
        // wte + wpe + L blocks of 12 C^2 + 13 C + final norm 2 C (see docs/trainer.md).
        for (cfg, want) in [
            (GptConfig::tiny(), 30_592),
            (GptConfig::small(), 16_102_912),
            (GptConfig::gpt2_medium(), 354_871_296),
            (GptConfig::gpt2_large(), 774_090_240),
            (GptConfig::gpt2_xl(), 1_557_686_400),
        ] {
            assert_eq!(ParamLayout::new(&cfg).num_params(), want, "{cfg:?}");
        }
    }

    #[test]
    fn tensors_tile_each_unit_without_gaps() {
        let layout = ParamLayout::new(&GptConfig::tiny());
        for unit in layout.units() {
            let mut next = 0;
            for t in &unit.tensors {
                assert_eq!(t.offset, next, "{}", t.name);
                assert_eq!(t.len, t.shape.iter().product::<usize>());
                next += t.len;
            }
            assert_eq!(next, unit.len);
        }
    }

    #[test]
    fn decay_applies_to_matrices_only() {
        let layout = ParamLayout::new(&GptConfig::tiny());
        for unit in layout.units() {
            for t in &unit.tensors {
                let matrix = t.shape.len() == 2 && t.name != "wpe";
                assert_eq!(t.weight_decay, matrix, "{}", t.name);
            }
        }
    }
}
