//! The sharded training state: one piece file per rank plus one manifest, in a
//! `step-NNNNNN` folder of a save directory (zero-train's `--save`), with a `latest`
//! pointer beside it.
//!
//! ```text
//! save/
//!   latest                   "step-000006\n": the newest complete state
//!   step-000006/
//!     manifest.json          format, version, step, partitioning, meta, files, pieces
//!     rank-00000.bin         rank 0's pieces: raw little-endian f32, back to back
//!     rank-00001.bin         ...
//!   step-000009.partial/     a save in progress (never read)
//! ```
//!
//! A *piece* is the states of one kind (`params`, `adam_m`, `adam_v`) of the elements
//! `start..start + len` of one unit, as one saving rank owned them. Each rank writes its
//! pieces only, so a save holds no more than the rank's own shards and the bytes on disk are
//! the model states once. Readers take the element ranges they need from whichever pieces
//! overlap them, so a state saved at one world size and stage loads at any other.
//!
//! A save is published in this order: every rank writes and fsyncs its file and an index
//! of its pieces into `step-N.partial/`; the ranks agree that all succeeded (a collective);
//! rank 0 merges the indexes into `manifest.json`, fsyncs it and the folder, renames the
//! folder to `step-N/`, fsyncs the parent, replaces `latest` (temp file, fsync, rename,
//! fsync), and only then prunes states beyond `keep_last` (`--keep-last`). A crash at any point leaves
//! `latest` naming a complete state (or absent, the complete states still there), except
//! between the two renames of a re-saved step (`step-N.old`), where `latest` may name a
//! missing folder, which resume refuses by name.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

use crate::error::{Result, StateError};
use crate::fsio::{failed, with_suffix, write_atomic};

/// Format name in the manifest.
pub const SHARDED_FORMAT: &str = "zero-train-sharded-state";
/// Format version written by this code; readers refuse newer versions. Version 2 added the
/// tensor-parallel axis (`tensor_parallel`, each piece's `tp_rank`); a version 1 state reads
/// as T = 1.
pub const SHARDED_VERSION: u32 = 2;
/// The oldest format version readers accept.
pub const OLDEST_SHARDED_VERSION: u32 = 1;
/// The manifest's file name inside a state folder.
pub const MANIFEST: &str = "manifest.json";
/// The pointer file naming the newest complete state folder of a save directory.
pub const LATEST: &str = "latest";
/// The tensors every unit stores, in the order each rank writes them.
pub const TENSORS: [&str; 3] = ["params", "adam_m", "adam_v"];

/// One contiguous run of one unit's states of one kind, stored in one piece file.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Piece {
    /// The piece file, relative to the state folder.
    pub file: String,
    /// The saving rank's tensor-parallel rank (0 at T = 1 and in version 1 states).
    #[serde(default)]
    pub tp_rank: usize,
    /// The unit.
    pub unit: usize,
    /// `params`, `adam_m` or `adam_v`.
    pub tensor: String,
    /// Element type of the stored values (`f32`).
    pub dtype: String,
    /// First element, in the coordinates of the whole (unpadded) unit.
    pub start: u64,
    /// Elements.
    pub len: u64,
    /// Byte offset in the file.
    pub offset: u64,
    /// Checksum of the piece's bytes (see `checksum.rs`).
    pub checksum: u64,
}

impl Piece {
    /// `unit3/adam_m[1024..2048]` (`tp1/unit3/...` for tensor-parallel rank 1): how errors
    /// name it.
    pub fn name(&self) -> String {
        let tp = match self.tp_rank {
            0 => String::new(),
            r => format!("tp{r}/"),
        };
        format!(
            "{tp}unit{}/{}[{}..{}]",
            self.unit,
            self.tensor,
            self.start,
            self.start.saturating_add(self.len)
        )
    }
}

/// A piece file and its length.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PieceFile {
    /// File name inside the state folder.
    pub name: String,
    /// Its length in bytes.
    pub bytes: u64,
}

/// How one unit was split when saved.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct UnitPartition {
    /// Real elements.
    pub numel: u64,
    /// Elements once padded to equal aligned shards.
    pub padded_numel: u64,
    /// Elements per shard, padding included.
    pub shard_len: u64,
    /// Each saving rank's owned real elements `[start, end)`, by data-parallel rank (the same
    /// for every tensor-parallel rank).
    pub owned: Vec<[u64; 2]>,
}

/// The configuration the state was saved at: informative (a reader needs only the pieces),
/// except `precision`, which must match the reader's.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Partitioning {
    /// Data-parallel ranks (N_d) of each tensor-parallel rank: the state has `world *
    /// tensor_parallel` piece files.
    pub world: usize,
    /// The tensor-parallel size T the units were split for (1 in version 1 states). A unit
    /// split across the group (a block's attention or MLP slice, the embedding's rows) has pieces from every tensor-parallel rank,
    /// each in that rank's coordinates; a unit replicated across it, from rank 0 only.
    #[serde(default = "one")]
    pub tensor_parallel: usize,
    /// ZeRO stage, 0-3.
    pub stage: u8,
    /// Storage precision of parameters (`fp32`, `bf16`, `fp16`); pieces hold f32 values
    /// (the master weights for half precision) whatever it is.
    pub precision: String,
    /// Every unit's split.
    pub units: Vec<UnitPartition>,
}

fn one() -> usize {
    1
}

/// `manifest.json`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ShardedManifest {
    /// [`SHARDED_FORMAT`].
    pub format: String,
    /// [`SHARDED_VERSION`] when written by this code.
    pub version: u32,
    /// Training steps done.
    pub step: u64,
    /// How the states were split.
    pub partitioning: Partitioning,
    /// The caller's metadata: run configuration, model shape, optimizer step count, data
    /// loader position, loss scale.
    pub meta: serde_json::Value,
    /// The piece files, by saving rank.
    pub files: Vec<PieceFile>,
    /// Every piece, by file then offset.
    pub pieces: Vec<Piece>,
}

/// The piece file of `rank` (the world rank `dp_rank * T + tp_rank`).
pub fn piece_file_name(rank: usize) -> String {
    format!("rank-{rank:05}.bin")
}

/// The index a rank writes beside its piece file for rank 0 to merge.
pub(crate) fn index_file_name(rank: usize) -> String {
    format!("rank-{rank:05}.index.json")
}

/// The folder of the state saved after `step` steps, inside the save directory.
pub fn step_dir(save: &Path, step: u64) -> PathBuf {
    save.join(format!("step-{step:06}"))
}

/// Where that state is written before it is published.
pub fn partial_dir(save: &Path, step: u64) -> PathBuf {
    with_suffix(&step_dir(save, step), ".partial")
}

/// The step of a complete state folder's name (`step-000006`; not `.partial` or `.old`).
fn step_of(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("step-")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Complete state folders of a save directory (named `step-N` and holding a manifest),
/// sorted by step.
pub fn complete_states(save: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let entries = std::fs::read_dir(save).map_err(failed("list", save))?;
    let mut out = Vec::new();
    for entry in entries {
        let path = entry.map_err(failed("list", save))?.path();
        let step = path.file_name().and_then(|n| n.to_str()).and_then(step_of);
        if let Some(step) = step {
            if path.join(MANIFEST).is_file() {
                out.push((step, path));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// The state folder `DIR` names (as zero-train's `--resume DIR`): `DIR` itself when it holds a manifest; else the
/// folder `DIR/latest` names; else (no `latest`) the highest complete `step-N` in `DIR`.
///
/// # Errors
/// [`StateError::BadState`] when `latest` names a folder that is not a complete state, or when
/// `DIR` holds no state.
pub fn resolve_state_dir(dir: &Path) -> Result<PathBuf> {
    if dir.join(MANIFEST).is_file() {
        return Ok(dir.to_path_buf());
    }
    if !dir.exists() {
        return Err(StateError::BadState {
            path: dir.to_path_buf(),
            reason: "no such folder".into(),
        });
    }
    let latest = dir.join(LATEST);
    if latest.is_file() {
        let text = std::fs::read_to_string(&latest).map_err(failed("read", &latest))?;
        let name = text.trim();
        let target = dir.join(name);
        if step_of(name).is_none() || !target.join(MANIFEST).is_file() {
            return Err(StateError::BadState {
                path: latest,
                reason: format!(
                    "it names {name:?}, which is not a complete state folder in {} (pass a \
                     step-N folder to --resume)",
                    dir.display()
                ),
            });
        }
        return Ok(target);
    }
    match complete_states(dir) {
        Ok(states) => match states.last() {
            Some((_, path)) => Ok(path.clone()),
            None => Err(no_state(dir)),
        },
        Err(_) => Err(no_state(dir)),
    }
}

fn no_state(dir: &Path) -> StateError {
    StateError::BadState {
        path: dir.to_path_buf(),
        reason: format!("no {MANIFEST}, no {LATEST} and no complete step-N folder"),
    }
}

/// Points `save/latest` at `step`'s folder, durably and atomically.
pub(crate) fn write_latest(save: &Path, step: u64) -> Result<()> {
    let path = save.join(LATEST);
    let name = format!("step-{step:06}\n");
    write_atomic(&path, |w| std::io::Write::write_all(w, name.as_bytes()))?;
    Ok(())
}

/// Removes complete states older than the newest `keep_last` (0 keeps all), and stale
/// `.partial` folders of earlier steps. Called after `latest` names the newest state.
pub(crate) fn prune(save: &Path, keep_last: usize, newest: u64) -> Result<()> {
    if keep_last > 0 {
        let states = complete_states(save)?;
        let excess = states.len().saturating_sub(keep_last);
        for (step, path) in states.into_iter().take(excess) {
            if step != newest {
                std::fs::remove_dir_all(&path).map_err(failed("remove", &path))?;
            }
        }
    }
    let entries = std::fs::read_dir(save).map_err(failed("list", save))?;
    for entry in entries {
        let path = entry.map_err(failed("list", save))?.path();
        let stale = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".partial"))
            .and_then(step_of)
            .is_some_and(|step| step < newest);
        if stale {
            std::fs::remove_dir_all(&path).map_err(failed("remove", &path))?;
        }
    }
    Ok(())
}
