//! Writing a sharded state: each rank's [`PieceWriter`], and rank 0's [`begin_save`] and
//! [`publish`] around them (the protocol is in `sharded.rs`).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::checksum::Checksum;
use crate::error::{Result, StateError};
use crate::fsio::{create_synced, failed, sync_dir, sync_parent, with_suffix};
use crate::sharded::{
    index_file_name, partial_dir, piece_file_name, prune, step_dir, write_latest, Partitioning,
    Piece, PieceFile, ShardedManifest, MANIFEST, SHARDED_FORMAT, SHARDED_VERSION,
};

const CHUNK_ELEMS: usize = 1 << 16;

/// A rank's index of its piece file, merged into the manifest by rank 0.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct PieceIndex {
    file: PieceFile,
    pieces: Vec<Piece>,
}

/// Rank 0, before any rank writes: creates `save/` and an empty `step-N.partial/` (removing
/// a stale one left by a crash). Returns the partial folder.
///
/// # Errors
/// [`StateError::Io`] naming the folder.
pub fn begin_save(save: &Path, step: u64) -> Result<PathBuf> {
    std::fs::create_dir_all(save).map_err(failed("create directory", save))?;
    let partial = partial_dir(save, step);
    if partial.exists() {
        std::fs::remove_dir_all(&partial).map_err(failed("remove stale", &partial))?;
    }
    std::fs::create_dir(&partial).map_err(failed("create directory", &partial))?;
    Ok(partial)
}

/// One rank's piece file, written piece by piece through a fixed-size buffer.
#[derive(Debug)]
pub struct PieceWriter {
    dir: PathBuf,
    rank: usize,
    tp_rank: usize,
    path: PathBuf,
    out: BufWriter<File>,
    offset: u64,
    pieces: Vec<Piece>,
    scratch: Vec<u8>,
}

impl PieceWriter {
    /// Creates the piece file of world rank `rank`, tensor-parallel rank `tp_rank` (0 at
    /// T = 1), in the partial folder `dir`.
    ///
    /// # Errors
    /// [`StateError::Io`] naming the file.
    pub fn create(dir: &Path, rank: usize, tp_rank: usize) -> Result<Self> {
        let path = dir.join(piece_file_name(rank));
        let file = File::create(&path).map_err(failed("create", &path))?;
        Ok(Self {
            dir: dir.to_path_buf(),
            rank,
            tp_rank,
            path,
            out: BufWriter::new(file),
            offset: 0,
            pieces: Vec::new(),
            scratch: Vec::with_capacity(CHUNK_ELEMS * 4),
        })
    }

    /// Appends the `tensor` values of elements `start..start + data.len()` of `unit`.
    ///
    /// # Errors
    /// [`StateError::Io`] naming the file.
    pub fn write(&mut self, unit: usize, tensor: &str, start: usize, data: &[f32]) -> Result<()> {
        let mut hash = Checksum::new();
        for chunk in data.chunks(CHUNK_ELEMS) {
            self.scratch.clear();
            for &x in chunk {
                self.scratch.extend_from_slice(&x.to_bits().to_le_bytes());
            }
            hash.update(&self.scratch);
            self.out
                .write_all(&self.scratch)
                .map_err(failed("write", &self.path))?;
        }
        let len = data.len() as u64;
        self.pieces.push(Piece {
            file: piece_file_name(self.rank),
            tp_rank: self.tp_rank,
            unit,
            tensor: tensor.into(),
            dtype: "f32".into(),
            start: start as u64,
            len,
            offset: self.offset,
            checksum: hash.finish(),
        });
        self.offset += 4 * len;
        Ok(())
    }

    /// Flushes and fsyncs the piece file, then writes and fsyncs its index.
    ///
    /// # Errors
    /// [`StateError::Io`] or [`StateError::Json`] naming the file.
    pub fn finish(self) -> Result<()> {
        let file = self
            .out
            .into_inner()
            .map_err(|e| failed("write", &self.path)(e.into_error()))?;
        file.sync_all().map_err(failed("sync", &self.path))?;
        let index = PieceIndex {
            file: PieceFile {
                name: piece_file_name(self.rank),
                bytes: self.offset,
            },
            pieces: self.pieces,
        };
        let index_path = self.dir.join(index_file_name(self.rank));
        let json = serde_json::to_vec(&index).map_err(|source| StateError::Json {
            path: index_path.clone(),
            source,
        })?;
        create_synced(&index_path, |w| w.write_all(&json))?;
        Ok(())
    }
}

/// Rank 0, once every rank's [`PieceWriter::finish`] succeeded: merges the `world * T` indexes
/// into `manifest.json`, publishes `step-N/`, points `latest` at it, then prunes to
/// `keep_last` states (0 keeps all). Returns the published folder.
///
/// # Errors
/// [`StateError::Io`], [`StateError::Json`] naming the file; [`StateError::BadState`] for an index that
/// does not belong to this save.
pub fn publish(
    save: &Path,
    step: u64,
    partitioning: Partitioning,
    meta: serde_json::Value,
    keep_last: usize,
) -> Result<PathBuf> {
    let partial = partial_dir(save, step);
    let ranks = partitioning.world * partitioning.tensor_parallel;
    let mut files = Vec::with_capacity(ranks);
    let mut pieces = Vec::new();
    for rank in 0..ranks {
        let path = partial.join(index_file_name(rank));
        let bytes = std::fs::read(&path).map_err(failed("read", &path))?;
        let index: PieceIndex =
            serde_json::from_slice(&bytes).map_err(|source| StateError::Json { path, source })?;
        files.push(index.file);
        pieces.extend(index.pieces);
    }
    let manifest = ShardedManifest {
        format: SHARDED_FORMAT.into(),
        version: SHARDED_VERSION,
        step,
        partitioning,
        meta,
        files,
        pieces,
    };
    let manifest_path = partial.join(MANIFEST);
    let json = serde_json::to_vec_pretty(&manifest).map_err(|source| StateError::Json {
        path: manifest_path.clone(),
        source,
    })?;
    create_synced(&manifest_path, |w| w.write_all(&json))?;
    for rank in 0..ranks {
        let path = partial.join(index_file_name(rank));
        std::fs::remove_file(&path).map_err(failed("remove", &path))?;
    }
    // The folder's entries must be durable before the rename publishes them.
    sync_dir(&partial)?;
    let dir = step_dir(save, step);
    replace_dir(&partial, &dir)?;
    write_latest(save, step)?;
    prune(save, keep_last, step)?;
    Ok(dir)
}

/// Renames `from` to `to`. An existing `to` (the same step saved by an earlier run) is
/// renamed to `to.old` first and removed once `to` is in place: between the two renames a
/// crash leaves `latest` naming a missing folder (resume then refuses it by name, and
/// `to.old` holds the earlier state).
fn replace_dir(from: &Path, to: &Path) -> Result<()> {
    let old = with_suffix(to, ".old");
    if to.exists() {
        if old.exists() {
            std::fs::remove_dir_all(&old).map_err(failed("remove stale", &old))?;
        }
        std::fs::rename(to, &old).map_err(failed("rename aside", to))?;
    }
    std::fs::rename(from, to).map_err(failed("rename into", to))?;
    sync_parent(to)?;
    if old.exists() {
        std::fs::remove_dir_all(&old).map_err(failed("remove", &old))?;
    }
    Ok(())
}
