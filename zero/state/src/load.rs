//! Loading a sharded state into an engine: each rank reads exactly the element ranges it
//! keeps under its own stage and world size, so a state saved at one world size and stage
//! loads at any other; [`load_sharded_with`] takes them through the caller's map from the
//! loading units to the saved ones (another tensor-parallel size).

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use zero::{Engine, StateKind};

use crate::error::{Result, StateError};
use crate::save::precision_name;
use crate::sharded::resolve_state_dir;
use crate::sharded_read::ShardedReader;

/// Where `len` elements of a unit being loaded come from: elements `start..start + len` of
/// the saved `unit` as tensor-parallel rank `tp_rank` saved it go to elements `at..at + len`
/// of the loading unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Source {
    /// The saving rank's tensor-parallel rank.
    pub tp_rank: usize,
    /// The saved unit.
    pub unit: usize,
    /// First element in the saved unit.
    pub start: usize,
    /// Elements.
    pub len: usize,
    /// First element in the loading unit.
    pub at: usize,
}

/// Loads the state `dir` names (a `step-N` folder, or a save directory: see
/// [`resolve_state_dir`]) into `engine`, saved with the engine's units and tensor-parallel
/// size: each rank reads the element ranges it keeps, of its own tensor-parallel rank for
/// the units split across the group and of rank 0 for the others. Returns the reader, for
/// the caller's `meta`. Not collective.
///
/// # Errors
/// [`StateError::Mismatch`] when the state's units, tensor-parallel size or precision
/// differ from the engine's; [`StateError::Tensor`], [`StateError::ChecksumMismatch`]
/// naming the file and piece for missing or corrupt data.
pub fn load_sharded(dir: &Path, engine: &mut Engine) -> Result<ShardedReader> {
    let dir = resolve_state_dir(dir)?;
    let reader = ShardedReader::open(&dir)?;
    let bad = |reason: String| StateError::Mismatch {
        dir: dir.clone(),
        reason,
    };
    let saved = &reader.manifest().partitioning;
    let (tp_rank, t) = engine
        .tensor_parallel()
        .map_or((0, 1), |tp| (tp.rank(), tp.size()));
    if saved.tensor_parallel != t {
        return Err(bad(format!(
            "it was saved at tensor-parallel size {}, this engine runs {t}",
            saved.tensor_parallel
        )));
    }
    let units = engine.units().len();
    if saved.units.len() != units {
        return Err(bad(format!(
            "it holds {} units, this model {units}",
            saved.units.len()
        )));
    }
    for unit in 0..units {
        let numel = engine.units()[unit].numel;
        if saved.units[unit].numel != numel as u64 {
            return Err(bad(format!(
                "its unit {unit} has {} elements, this model's {numel}",
                saved.units[unit].numel
            )));
        }
    }
    let sliced: Vec<bool> = engine.units().iter().map(|u| u.tp_sharded).collect();
    load_into(&reader, engine, |unit, held| {
        let from = if sliced[unit] { tp_rank } else { 0 };
        Ok(vec![Source {
            tp_rank: from,
            unit,
            start: held.start,
            len: held.len(),
            at: held.start,
        }])
    })?;
    Ok(reader)
}

/// Loads the state `dir` names into `engine` through `sources`, which says, for a unit and
/// the element range this rank keeps of it, where those elements are in the saved state
/// (they must cover the range exactly): a state saved with other units, such as another
/// tensor-parallel size's. Returns the reader. Not collective.
///
/// # Errors
/// [`StateError::Mismatch`] for another precision, or what `sources` refuses;
/// [`StateError::Tensor`] for sources that do not cover a range exactly or fall outside the
/// saved units; [`StateError::ChecksumMismatch`] naming the file and piece.
pub fn load_sharded_with(
    dir: &Path,
    engine: &mut Engine,
    sources: impl Fn(usize, Range<usize>) -> std::result::Result<Vec<Source>, String>,
) -> Result<ShardedReader> {
    let dir = resolve_state_dir(dir)?;
    let reader = ShardedReader::open(&dir)?;
    load_into(&reader, engine, sources)?;
    Ok(reader)
}

/// Checks the precision, then fills every unit's kept range of every kind from `sources`.
fn load_into(
    reader: &ShardedReader,
    engine: &mut Engine,
    sources: impl Fn(usize, Range<usize>) -> std::result::Result<Vec<Source>, String>,
) -> Result<()> {
    let dir = reader.dir().to_path_buf();
    let saved = &reader.manifest().partitioning;
    let precision = precision_name(engine.config().precision);
    if saved.precision != precision {
        return Err(StateError::Mismatch {
            dir,
            reason: format!(
                "it was saved at precision {}, this run uses {precision} (pass --precision {})",
                saved.precision, saved.precision
            ),
        });
    }
    for unit in 0..engine.units().len() {
        // The kinds may keep different ranges (whole parameters beside sharded moments).
        let mut mapped: Option<(Range<usize>, Vec<Source>)> = None;
        for kind in StateKind::ALL {
            let held = engine.held_range(unit, kind)?;
            if mapped.as_ref().is_none_or(|(range, _)| *range != held) {
                let list = sources(unit, held.clone()).map_err(|reason| StateError::Mismatch {
                    dir: dir.clone(),
                    reason,
                })?;
                mapped = Some((held.clone(), list));
            }
            let list = mapped.as_ref().map_or(&[][..], |(_, list)| list.as_slice());
            let values = reader.read_mapped(kind.name(), list, &held, unit)?;
            engine.import_owned(unit, kind, held, &values)?;
        }
    }
    Ok(())
}

impl ShardedReader {
    /// The `tensor` values of elements `range` of a unit (`unit` names it in errors) taken
    /// from the saved elements `sources` list, which must cover `range` exactly: one read
    /// per saved (tensor-parallel rank, unit), over the span its sources touch, then
    /// scattered.
    ///
    /// # Errors
    /// [`StateError::Tensor`] for sources that do not cover `range` exactly or fall outside
    /// the saved units; as [`ShardedReader::read_tp_range`].
    pub fn read_mapped(
        &self,
        tensor: &str,
        sources: &[Source],
        range: &Range<usize>,
        unit: usize,
    ) -> Result<Vec<f32>> {
        // An empty source moves nothing and could name any element: left out.
        let sources: Vec<Source> = sources.iter().filter(|s| s.len > 0).copied().collect();
        self.check_cover(&sources, range, unit)?;
        let mut values = vec![0f32; range.len()];
        let mut spans: BTreeMap<(usize, usize), Range<usize>> = BTreeMap::new();
        for s in &sources {
            let span = spans
                .entry((s.tp_rank, s.unit))
                .or_insert(s.start..s.start + s.len);
            *span = span.start.min(s.start)..span.end.max(s.start + s.len);
        }
        for ((tp_rank, saved_unit), span) in spans {
            let mut buf = vec![0f32; span.len()];
            self.read_tp_range(tp_rank, saved_unit, tensor, span.clone(), &mut buf)?;
            let mine = sources
                .iter()
                .filter(|s| (s.tp_rank, s.unit) == (tp_rank, saved_unit));
            for s in mine {
                let (from, to) = (s.start - span.start, s.at - range.start);
                values[to..to + s.len].copy_from_slice(&buf[from..from + s.len]);
            }
        }
        Ok(values)
    }

    /// The (non-empty) sources tile `range` exactly, so no element is left unset or set
    /// twice, and none's ends overflow.
    fn check_cover(&self, sources: &[Source], range: &Range<usize>, unit: usize) -> Result<()> {
        let sound =
            |s: &Source| s.at.checked_add(s.len).is_some() && s.start.checked_add(s.len).is_some();
        let total = sources.iter().try_fold(0usize, |sum, s| {
            sound(s).then(|| sum.checked_add(s.len)).flatten()
        });
        let mut sorted: Vec<&Source> = sources.iter().collect();
        sorted.sort_by_key(|s| s.at);
        let mut end = range.start;
        for s in sorted {
            if s.at != end || !sound(s) {
                break;
            }
            end = s.at + s.len;
        }
        if end != range.end || total != Some(range.len()) {
            return Err(StateError::Tensor {
                path: self.dir().to_path_buf(),
                name: format!("unit{unit}"),
                reason: format!(
                    "the saved elements mapped to it do not cover its elements {}..{} exactly",
                    range.start, range.end
                ),
            });
        }
        Ok(())
    }
}

/// Reads and verifies every piece of the state `dir` names; returns its folder and step.
///
/// # Errors
/// [`StateError::Tensor`], [`StateError::ChecksumMismatch`] naming the file and piece.
pub fn verify_state(dir: &Path) -> Result<(PathBuf, u64)> {
    let state_dir = resolve_state_dir(dir)?;
    let reader = ShardedReader::open(&state_dir)?;
    reader.verify()?;
    Ok((state_dir, reader.manifest().step))
}
