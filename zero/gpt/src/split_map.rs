//! Where a rank's part of a split unit comes from in the whole unit: the inverse of
//! [`slice_part`](crate::slice_part) as runs of elements contiguous on both sides, so that a
//! unit's elements can be moved between tensor-parallel sizes without building the whole
//! unit (checkpoints saved at one T and read at another).
//!
//! Legend as in `split`: C channels, T the tensor-parallel size, r the rank in the group.

use crate::config::GptConfig;
use crate::error::{GptError, Result};
use crate::layout::{ParamLayout, UnitKind, UnitLayout};
use crate::split::TpSplit;

/// `len` elements at `part` in a rank's unit that are the elements at `whole` of the whole
/// (T = 1) unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    /// First element in the whole unit.
    pub whole: usize,
    /// Elements.
    pub len: usize,
    /// First element in the rank's unit.
    pub part: usize,
}

/// The runs of rank `split.rank`'s part of tensor `name` (`numel` elements whole), in
/// tensor-local offsets and part order: the same cut as `split::slice_tensor`.
fn tensor_runs(config: &GptConfig, split: TpSplit, name: &str, numel: usize) -> Vec<Run> {
    let (c, t, r) = (config.channels, split.size, split.rank);
    let mut runs = Vec::new();
    let mut push = |whole: usize, len: usize| {
        let part = runs.last().map_or(0, |p: &Run| p.part + p.len);
        runs.push(Run { whole, len, part });
    };
    let mut columns = |width: usize| {
        let part = width / t;
        for row in 0..numel / width {
            push(row * width + r * part, part);
        }
    };
    match name {
        "qkvw" | "qkvb" => {
            let width = if name == "qkvw" { c } else { 1 };
            for third in 0..3 {
                push((third * c + r * c / t) * width, c / t * width);
            }
        }
        "fcw" => push(r * 4 * c / t * c, 4 * c / t * c),
        "fcb" => push(r * 4 * c / t, 4 * c / t),
        "attprojw" => columns(c),
        "fcprojw" => columns(4 * c),
        "wte" => {
            let rows = config.padded_vocab_size / t;
            push(r * rows * c, rows * c);
        }
        _ => push(0, numel),
    }
    runs
}

/// The runs of `part` (a unit of rank `split.rank`: a slice, cut as
/// [`slice_part`](crate::slice_part) cuts it, or any other unit, whose tensors are whole) in
/// the whole unit laid out as `whole_layout`, in unit offsets and part order; they cover
/// `part` exactly.
///
/// # Errors
/// [`GptError::SizeMismatch`] when `part` names a tensor the whole unit lacks, or a
/// tensor's runs do not add up to its length.
pub fn part_runs(
    config: &GptConfig,
    split: TpSplit,
    whole_layout: &UnitLayout,
    part: &UnitLayout,
) -> Result<Vec<Run>> {
    let mismatch = |what, expected, got| GptError::SizeMismatch {
        what,
        expected,
        got,
    };
    // Only slices are cut; every other unit holds its tensors whole at any T.
    let cut = part.kind.is_slice();
    let mut out = Vec::new();
    for spec in &part.tensors {
        let from = whole_layout
            .tensor(spec.name)
            .ok_or_else(|| mismatch("tensors of the whole unit named like the part's", 1, 0))?;
        let runs = match cut {
            true => tensor_runs(config, split, spec.name, from.len),
            false => vec![Run {
                whole: 0,
                len: from.len,
                part: 0,
            }],
        };
        let len: usize = runs.iter().map(|r| r.len).sum();
        if len != spec.len {
            return Err(mismatch("runs of a split tensor", spec.len, len));
        }
        out.extend(runs.into_iter().map(|r| Run {
            whole: from.offset + r.whole,
            len: r.len,
            part: spec.offset + r.part,
        }));
    }
    Ok(out)
}

/// Where unit `unit` of rank `split.rank` comes from, the rank laid out as `layout`
/// ([`ParamLayout::split`] or [`ParamLayout::split_vocab`] of `config` at `split.size`): the
/// index of its whole unit under [`ParamLayout::new`] and its [`part_runs`] there. A block's
/// attention and MLP slices and the embedding's rows differ by rank; every other unit is its whole unit (one
/// run), a block's replicated tensors or the position embedding, the same on every rank.
///
/// # Errors
/// [`GptError::InvalidConfig`] for a split [`TpSplit::validate`] (or, with the vocabulary
/// split, [`TpSplit::validate_vocab`]) refuses, a layout of another T, or a unit past the
/// layout's; [`GptError::SizeMismatch`] as [`part_runs`].
pub fn unit_origin(
    config: &GptConfig,
    layout: &ParamLayout,
    split: TpSplit,
    unit: usize,
) -> Result<(usize, Vec<Run>)> {
    match layout.vocab_parallel() {
        true => split.validate_vocab(config)?,
        false => split.validate(config)?,
    }
    if layout.tensor_parallel() != split.size {
        return Err(GptError::InvalidConfig {
            field: "tensor_parallel",
            value: layout.tensor_parallel(),
            reason: "the layout is split over another number of ranks than the split's",
        });
    }
    let part = layout.units().get(unit).ok_or(GptError::InvalidConfig {
        field: "unit",
        value: unit,
        reason: "is past the units of the split layout",
    })?;
    let whole_unit = match part.kind {
        UnitKind::Embedding | UnitKind::EmbeddingSlice | UnitKind::Positions => 0,
        UnitKind::FinalNorm => config.num_layers + 1,
        UnitKind::Block { layer }
        | UnitKind::AttentionSlice { layer }
        | UnitKind::MlpSlice { layer }
        | UnitKind::BlockReplicated { layer } => ParamLayout::block_unit(layer),
    };
    let whole = ParamLayout::new(config);
    let runs = part_runs(config, split, &whole.units()[whole_unit], part)?;
    Ok((whole_unit, runs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::GptConfig;
    use crate::split::slice_part;
    use proptest::prelude::*;

    fn config(heads: usize, head_size: usize, layers: usize) -> GptConfig {
        let mut c = GptConfig::tiny();
        c.num_heads = heads;
        c.channels = heads * head_size;
        c.num_layers = layers;
        c
    }

    /// What rank `split` holds of `whole` as `part`: a block's parts cut by `slice_part`,
    /// any other unit whole (as `init_split_unit` keeps them).
    fn expected_part(
        config: &GptConfig,
        split: TpSplit,
        whole_layout: &UnitLayout,
        whole: &[f32],
        part: &UnitLayout,
    ) -> Vec<f32> {
        let block_part = matches!(
            part.kind,
            UnitKind::AttentionSlice { .. }
                | UnitKind::MlpSlice { .. }
                | UnitKind::BlockReplicated { .. }
                | UnitKind::EmbeddingSlice
                | UnitKind::Positions
        );
        if !block_part {
            return whole.to_vec();
        }
        let mut out = vec![0f32; part.len];
        slice_part(config, split, whole_layout, whole, part, &mut out).unwrap();
        out
    }

    /// Every whole unit assembled from the ranks' parts through the runs (slices from every
    /// rank, the rest from rank 0) equals the original to the bit, each element set once;
    /// and each part gathered through its runs equals `slice_part`'s.
    fn check_round_trip(config: &GptConfig, t: usize, vocab: bool) {
        let whole = ParamLayout::new(config);
        let split_layout = match vocab {
            true => ParamLayout::split_vocab(config, t),
            false => ParamLayout::split(config, t),
        };
        let original: Vec<Vec<f32>> = whole
            .units()
            .iter()
            .enumerate()
            .map(|(u, l)| (0..l.len).map(|i| (u * 100_003 + i) as f32 * 0.5).collect())
            .collect();
        let mut rebuilt: Vec<Vec<Option<f32>>> =
            whole.units().iter().map(|l| vec![None; l.len]).collect();
        for rank in 0..t {
            let split = TpSplit { size: t, rank };
            for (unit, part) in split_layout.units().iter().enumerate() {
                let (w, runs) = unit_origin(config, &split_layout, split, unit).unwrap();
                let sliced = expected_part(config, split, &whole.units()[w], &original[w], part);
                let mut gathered = vec![f32::NAN; part.len];
                for r in &runs {
                    gathered[r.part..r.part + r.len]
                        .copy_from_slice(&original[w][r.whole..r.whole + r.len]);
                }
                assert_eq!(gathered, sliced, "T {t} rank {rank} unit {unit}");
                let sliced_unit = part.kind.is_slice();
                if rank > 0 && !sliced_unit {
                    continue;
                }
                for r in &runs {
                    for i in 0..r.len {
                        let slot = &mut rebuilt[w][r.whole + i];
                        assert!(slot.is_none(), "element {} of unit {w} twice", r.whole + i);
                        *slot = Some(sliced[r.part + i]);
                    }
                }
            }
        }
        for (w, unit) in rebuilt.iter().enumerate() {
            let values: Vec<f32> = unit.iter().map(|v| v.expect("every element set")).collect();
            assert_eq!(values, original[w], "whole unit {w} at T {t}");
        }
    }

    #[test]
    fn slices_assembled_through_their_runs_are_the_whole_model_to_the_bit() {
        for t in [1, 2, 4] {
            check_round_trip(&config(4, 2, 2), t, false);
            check_round_trip(&config(4, 2, 2), t, true);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(16))]
        #[test]
        fn runs_invert_slicing_for_any_small_shape(
            heads_per_rank in 1usize..3, head_size in 1usize..4, layers in 1usize..3,
            t in prop::sample::select(vec![1usize, 2, 3]),
        ) {
            let c = config(heads_per_rank * t, head_size, layers);
            check_round_trip(&c, t, false);
            // The vocabulary splits where T divides its padding (128: not at T = 3).
            if c.padded_vocab_size % t == 0 {
                check_round_trip(&c, t, true);
            }
        }
    }

    #[test]
    fn a_unit_past_the_layout_is_an_error() {
        let c = config(2, 2, 1);
        let layout = ParamLayout::split(&c, 2);
        assert!(unit_origin(&c, &layout, TpSplit { size: 2, rank: 0 }, 99).is_err());
        // A layout of another T.
        assert!(unit_origin(&c, &layout, TpSplit { size: 1, rank: 0 }, 0).is_err());
    }
}
