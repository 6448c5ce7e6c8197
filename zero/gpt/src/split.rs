//! Megatron-style tensor parallelism of the blocks: which part of each block tensor a rank of
//! a tensor-parallel group of T ranks holds, and the slicing of a whole block into it.
//!
//! Legend: C channels, NH heads, hs = C/NH, T here the tensor-parallel size, r the rank in
//! the group.
//!
//! QKV and MLP-up are column-parallel: rank r holds the rows of its NH/T heads in each of q,
//! k and v (`qkvw` (3C/T, C), `qkvb` (3C/T)) and rows `r*4C/T..(r+1)*4C/T` of `fcw` and `fcb`.
//! Attention-out and MLP-down are row-parallel: rank r holds columns `r*C/T..(r+1)*C/T` of
//! `attprojw` (C, C/T) and `r*4C/T..(r+1)*4C/T` of `fcprojw` (C, 4C/T); their biases are
//! replicated (rank 0 adds them into its partial output, so the group's sum holds them
//! once), as are the LayerNorms. A block at T > 1 is three units
//! ([`ParamLayout::split`](crate::ParamLayout::split)): its attention slice (qkvw, qkvb,
//! attprojw), its MLP slice (fcw, fcb, fcprojw), then its replicated tensors. With the vocabulary split as well
//! ([`ParamLayout::split_vocab`](crate::ParamLayout::split_vocab)), rank r holds rows
//! `r*Vp/T..(r+1)*Vp/T` of `wte` (T must divide Vp), and `wpe` whole in a unit of its own.
//! Every tensor is made whole as at T = 1 and sliced ([`slice_part`]), so every T starts
//! from the same model.

use crate::config::GptConfig;
use crate::error::{GptError, Result};
use crate::layout::UnitLayout;

/// A rank's place in a tensor-parallel group: T (`size`) and its rank in the group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TpSplit {
    /// T, the ranks of the group; 1 is no split.
    pub size: usize,
    /// This rank's index in the group, `0..size`.
    pub rank: usize,
}

impl TpSplit {
    /// No split: one rank holds every block whole.
    pub const NONE: Self = Self { size: 1, rank: 0 };

    /// Checks the split against `config`: T at least 1, the rank below T, and T dividing
    /// the heads (so each rank holds whole heads) and 4C (the MLP's width).
    ///
    /// # Errors
    /// [`GptError::InvalidConfig`] naming the field T does not divide.
    pub fn validate(&self, config: &GptConfig) -> Result<()> {
        let bad = |field, value, reason| {
            Err(GptError::InvalidConfig {
                field,
                value,
                reason,
            })
        };
        if self.size == 0 {
            return bad("tensor_parallel_size", 0, "must be at least 1");
        }
        if self.rank >= self.size {
            return bad("tensor_parallel_rank", self.rank, "must be below T");
        }
        if config.num_heads % self.size != 0 {
            return bad(
                "num_heads",
                config.num_heads,
                "must be a multiple of the tensor-parallel size",
            );
        }
        // C = NH * hs, so T dividing NH divides C and 4C; checked anyway, with checked
        // arithmetic, as the MLP's width is what the slices are cut from.
        let width = config.channels.checked_mul(4);
        if width.is_none_or(|w| w % self.size != 0) {
            return bad(
                "channels",
                config.channels,
                "4C must be a multiple of the tensor-parallel size",
            );
        }
        Ok(())
    }

    /// [`TpSplit::validate`], and T dividing Vp, for a group that splits the vocabulary too.
    ///
    /// # Errors
    /// As [`TpSplit::validate`]; [`GptError::InvalidConfig`] naming `padded_vocab_size`.
    pub fn validate_vocab(&self, config: &GptConfig) -> Result<()> {
        self.validate(config)?;
        if config.padded_vocab_size % self.size != 0 {
            return Err(GptError::InvalidConfig {
                field: "padded_vocab_size",
                value: config.padded_vocab_size,
                reason: "must be a multiple of the tensor-parallel size to split the vocabulary",
            });
        }
        Ok(())
    }
}

/// The attention slice unit's tensors (rank-local shapes), in buffer order.
pub(crate) fn attention_slice_specs(c: usize, t: usize) -> Vec<(&'static str, Vec<usize>)> {
    vec![
        ("qkvw", vec![3 * c / t, c]),
        ("qkvb", vec![3 * c / t]),
        ("attprojw", vec![c, c / t]),
    ]
}

/// The MLP slice unit's tensors (rank-local shapes), in buffer order.
pub(crate) fn mlp_slice_specs(c: usize, t: usize) -> Vec<(&'static str, Vec<usize>)> {
    vec![
        ("fcw", vec![4 * c / t, c]),
        ("fcb", vec![4 * c / t]),
        ("fcprojw", vec![c, 4 * c / t]),
    ]
}

/// The replicated unit's tensors, in buffer order.
pub(crate) fn replicated_specs(c: usize) -> Vec<(&'static str, Vec<usize>)> {
    vec![
        ("ln1w", vec![c]),
        ("ln1b", vec![c]),
        ("attprojb", vec![c]),
        ("ln2w", vec![c]),
        ("ln2b", vec![c]),
        ("fcprojb", vec![c]),
    ]
}

/// Rank `split.rank`'s part of tensor `name` of a whole block of `config` (`whole` holds it,
/// in the T = 1 layout's shape): rows of its heads of q, k and v; its rows of `fcw`, `fcb`;
/// its columns of `attprojw`, `fcprojw`; its Vp/T rows of `wte`; any other tensor whole.
fn slice_tensor(config: &GptConfig, split: TpSplit, name: &str, whole: &[f32]) -> Vec<f32> {
    let (c, t, r) = (config.channels, split.size, split.rank);
    let rows =
        |from: usize, len: usize, width: usize| whole[from * width..(from + len) * width].to_vec();
    let columns = |width: usize| {
        let part = width / t;
        whole
            .chunks_exact(width)
            .flat_map(|row| row[r * part..(r + 1) * part].iter().copied())
            .collect()
    };
    match name {
        "qkvw" | "qkvb" => {
            let width = if name == "qkvw" { c } else { 1 };
            (0..3)
                .flat_map(|part| rows(part * c + r * c / t, c / t, width))
                .collect()
        }
        "fcw" => rows(r * 4 * c / t, 4 * c / t, c),
        "fcb" => rows(r * 4 * c / t, 4 * c / t, 1),
        "attprojw" => columns(c),
        "fcprojw" => columns(4 * c),
        "wte" => {
            let part = config.padded_vocab_size / t;
            rows(r * part, part, c)
        }
        _ => whole.to_vec(),
    }
}

/// Fills `out`, a unit laid out as `part` (a block's attention or MLP slice or its
/// replicated tensors; with the vocabulary split, the embedding's slice or `wpe`), with rank
/// `split.rank`'s part of the whole unit `whole` laid out as `whole_layout` (T = 1: the
/// block, or unit 0).
///
/// # Errors
/// [`GptError::SizeMismatch`] when `whole` or `out` does not match its layout, or `part`
/// names a tensor the whole block lacks.
pub fn slice_part(
    config: &GptConfig,
    split: TpSplit,
    whole_layout: &UnitLayout,
    whole: &[f32],
    part: &UnitLayout,
    out: &mut [f32],
) -> Result<()> {
    let mismatch = |what, expected, got| GptError::SizeMismatch {
        what,
        expected,
        got,
    };
    if whole.len() != whole_layout.len {
        return Err(mismatch("whole block", whole_layout.len, whole.len()));
    }
    if out.len() != part.len {
        return Err(mismatch("block part", part.len, out.len()));
    }
    for spec in &part.tensors {
        let from = whole_layout
            .tensor(spec.name)
            .ok_or_else(|| mismatch("tensors of the whole unit named like the part's", 1, 0))?;
        let sliced = slice_tensor(
            config,
            split,
            spec.name,
            &whole[from.offset..from.offset + from.len],
        );
        if sliced.len() != spec.len {
            return Err(mismatch("sliced tensor", spec.len, sliced.len()));
        }
        out[spec.offset..spec.offset + spec.len].copy_from_slice(&sliced);
    }
    Ok(())
}
