//! Whole-model units to and from the units of a tensor-parallel rank (`--init-from` and
//! `--export-llmc` at T > 1), through zero-gpt's [`unit_origin`] runs: a rank's unit is cut
//! from its whole unit, and a whole unit is assembled from the group's block slices and
//! rank 0's other units.

use zero_gpt::{unit_origin, GptConfig, TpSplit};

use crate::bridge::split_layout;

use crate::error::TrainError;

/// The units of a rank at tensor-parallel size `t` ([`split_layout`]) that make whole unit
/// `whole`, in layout order, each with whether it is a slice (which differs by rank; the
/// others are the same on every rank).
///
/// # Errors
/// A `t` that does not split `model`.
pub(crate) fn parts_of(
    model: &GptConfig,
    t: usize,
    whole: usize,
) -> Result<Vec<(usize, bool)>, TrainError> {
    let layout = split_layout(model, t);
    let mut parts = Vec::new();
    for (unit, part) in layout.units().iter().enumerate() {
        if unit_origin(model, &layout, TpSplit { size: t, rank: 0 }, unit)?.0 == whole {
            parts.push((unit, part.kind.is_slice()));
        }
    }
    Ok(parts)
}

/// Copies `values`, unit `unit` of rank `split`, into its places in `whole` (its whole
/// unit's elements).
///
/// # Errors
/// As [`unit_origin`]; a `values` or `whole` shorter than the runs need.
pub(crate) fn place(
    model: &GptConfig,
    split: TpSplit,
    unit: usize,
    values: &[f32],
    whole: &mut [f32],
) -> Result<(), TrainError> {
    let (_, runs) = unit_origin(model, &split_layout(model, split.size), split, unit)?;
    let need = |r: &zero_gpt::Run| (r.part + r.len, r.whole + r.len);
    let (part_len, whole_len) = runs
        .iter()
        .map(need)
        .fold((0, 0), |a, b| (a.0.max(b.0), a.1.max(b.1)));
    check_len("values of a tensor-parallel unit", part_len, values.len())?;
    check_len("whole unit", whole_len, whole.len())?;
    for r in runs {
        whole[r.whole..r.whole + r.len].copy_from_slice(&values[r.part..r.part + r.len]);
    }
    Ok(())
}

/// Unit `unit` of rank `split`, cut from the whole model's units `whole`.
///
/// # Errors
/// As [`unit_origin`]; whole units shorter than the runs need.
pub(crate) fn cut(
    model: &GptConfig,
    split: TpSplit,
    unit: usize,
    whole: &[Vec<f32>],
) -> Result<Vec<f32>, TrainError> {
    let (w, runs) = unit_origin(model, &split_layout(model, split.size), split, unit)?;
    let source = whole.get(w).map_or(&[][..], Vec::as_slice);
    let need = runs.iter().map(|r| r.whole + r.len).max().unwrap_or(0);
    check_len("whole unit", need, source.len())?;
    let mut out = vec![0f32; runs.iter().map(|r| r.len).sum()];
    for r in runs {
        out[r.part..r.part + r.len].copy_from_slice(&source[r.whole..r.whole + r.len]);
    }
    Ok(out)
}

/// At least `expected` elements in `what`.
fn check_len(what: &'static str, expected: usize, got: usize) -> Result<(), TrainError> {
    if got < expected {
        return Err(TrainError::Model(zero_gpt::GptError::SizeMismatch {
            what,
            expected,
            got,
        }));
    }
    Ok(())
}
