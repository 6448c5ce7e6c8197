//! Resuming at another tensor-parallel size: every unit of a loading rank and every saved
//! unit are placed in whole-model (T = 1) coordinates through zero-gpt's [`unit_origin`]
//! runs, and each element range a rank keeps is taken from the saved runs that overlap it.
//! Parameters and Adam's moments move alike (the map knows elements, not kinds).

use std::ops::Range;
use zero_gpt::{unit_origin, GptConfig, Run, TpSplit};

use crate::bridge::split_layout;
use zero_state::{Partitioning, Source};

/// `len` elements at `whole` of a whole unit, saved by tensor-parallel rank `tp_rank` as
/// elements `start..start + len` of its `unit`.
#[derive(Debug, Clone, Copy)]
struct Saved {
    whole: usize,
    len: usize,
    tp_rank: usize,
    unit: usize,
    start: usize,
}

/// Where each loading unit's elements are in a state saved at another tensor-parallel size.
#[derive(Debug)]
pub(crate) struct TpMap {
    /// By loading unit: its whole unit and its runs there.
    target: Vec<(usize, Vec<Run>)>,
    /// By whole unit: the saved runs, sorted by whole offset (disjoint, covering it).
    saved: Vec<Vec<Saved>>,
}

impl TpMap {
    /// The map for rank `split` of `model` from a state saved as `saved` (its T read from
    /// it; units as [`split_layout`] lays them out, slices from every rank, the rest from
    /// rank 0).
    ///
    /// # Errors
    /// A reason, when the saved T does not split `model` or the saved units are not the
    /// units of `model` split at that T.
    pub(crate) fn new(
        model: &GptConfig,
        saved: &Partitioning,
        split: TpSplit,
    ) -> Result<Self, String> {
        let t = saved.tensor_parallel;
        let to = split.size;
        if (TpSplit { size: t, rank: 0 })
            .validate_vocab(model)
            .is_err()
        {
            return Err(format!(
                "it records tensor-parallel size {t}, which does not split this model's {} \
                 heads and vocabulary padded to {} (an edited or corrupt manifest), so it \
                 cannot be mapped to --tensor-parallel-size {to}",
                model.num_heads, model.padded_vocab_size
            ));
        }
        let layout = split_layout(model, t);
        let lens = layout.unit_lens();
        let saved_lens: Vec<usize> = saved.units.iter().map(|u| u.numel as usize).collect();
        if lens != saved_lens {
            return Err(format!(
                "its units ({saved_lens:?} elements) are not this model's split at its \
                 tensor-parallel size {t} ({lens:?}; an edited or corrupt manifest), so it \
                 cannot be mapped to --tensor-parallel-size {to}"
            ));
        }
        let mut by_whole: Vec<Vec<Saved>> = vec![Vec::new(); model.num_layers + 2];
        for (unit, part) in layout.units().iter().enumerate() {
            let ranks = if part.kind.is_slice() { t } else { 1 };
            for tp_rank in 0..ranks {
                let (whole, runs) = origin(
                    model,
                    TpSplit {
                        size: t,
                        rank: tp_rank,
                    },
                    unit,
                )?;
                by_whole[whole].extend(runs.iter().map(|r| Saved {
                    whole: r.whole,
                    len: r.len,
                    tp_rank,
                    unit,
                    start: r.part,
                }));
            }
        }
        for runs in &mut by_whole {
            runs.sort_by_key(|s| s.whole);
        }
        let units = split_layout(model, split.size).num_units();
        let target = (0..units)
            .map(|unit| origin(model, split, unit))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            target,
            saved: by_whole,
        })
    }

    /// Elements of loading unit `unit` (0 past the layout).
    pub(crate) fn unit_len(&self, unit: usize) -> usize {
        self.target
            .get(unit)
            .map_or(0, |(_, runs)| runs.iter().map(|r| r.len).sum())
    }

    /// The saved elements of loading `unit`'s elements `held`, in its coordinates.
    ///
    /// # Errors
    /// A unit past the loading layout's.
    pub(crate) fn sources(&self, unit: usize, held: Range<usize>) -> Result<Vec<Source>, String> {
        let (whole, runs) = self
            .target
            .get(unit)
            .ok_or_else(|| format!("unit {unit} is past this model's units"))?;
        let saved = &self.saved[*whole];
        let mut out = Vec::new();
        for run in runs {
            let (p0, p1) = (held.start.max(run.part), held.end.min(run.part + run.len));
            if p0 >= p1 {
                continue;
            }
            let (wa, wb) = (run.whole + (p0 - run.part), run.whole + (p1 - run.part));
            let first = saved.partition_point(|s| s.whole + s.len <= wa);
            for s in saved[first..].iter().take_while(|s| s.whole < wb) {
                let (a, b) = (wa.max(s.whole), wb.min(s.whole + s.len));
                out.push(Source {
                    tp_rank: s.tp_rank,
                    unit: s.unit,
                    start: s.start + (a - s.whole),
                    len: b - a,
                    at: p0 + (a - wa),
                });
            }
        }
        Ok(out)
    }
}

/// [`unit_origin`], its error as a reason.
fn origin(model: &GptConfig, split: TpSplit, unit: usize) -> Result<(usize, Vec<Run>), String> {
    let layout = split_layout(model, split.size);
    unit_origin(model, &layout, split, unit)
        .map_err(|e| format!("unit {unit} at T = {}: {e}", split.size))
}
