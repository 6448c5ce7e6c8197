//! Loading a sharded state into an engine: each rank reads exactly the element ranges it
//! keeps under its own stage and world size, so a state saved at one world size and stage
//! loads at any other.

use std::path::{Path, PathBuf};
use zero::{Engine, StateKind};

use crate::error::{Result, StateError};
use crate::save::precision_name;
use crate::sharded::resolve_state_dir;
use crate::sharded_read::ShardedReader;

/// Loads the state `dir` names (a `step-N` folder, or a save directory: see
/// [`resolve_state_dir`]) into `engine`: each rank reads the element ranges it keeps.
/// Returns the reader, for the caller's `meta`. Not collective.
///
/// # Errors
/// [`StateError::Mismatch`] when the state's units or precision differ from the engine's;
/// [`StateError::Tensor`], [`StateError::ChecksumMismatch`] naming the file and piece for
/// missing or corrupt data.
pub fn load_sharded(dir: &Path, engine: &mut Engine) -> Result<ShardedReader> {
    let dir = resolve_state_dir(dir)?;
    let reader = ShardedReader::open(&dir)?;
    let bad = |reason: String| StateError::Mismatch {
        dir: dir.clone(),
        reason,
    };
    let saved = &reader.manifest().partitioning;
    let precision = precision_name(engine.config().precision);
    if saved.precision != precision {
        return Err(bad(format!(
            "it was saved at precision {}, this run uses {precision} (pass --precision {})",
            saved.precision, saved.precision
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
        for kind in StateKind::ALL {
            let held = engine.held_range(unit, kind)?;
            let mut values = vec![0f32; held.len()];
            reader.read_range(unit, kind.name(), held.clone(), &mut values)?;
            engine.import_owned(unit, kind, held, &values)?;
        }
    }
    Ok(reader)
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
