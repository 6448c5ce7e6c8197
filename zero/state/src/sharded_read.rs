//! Reading a sharded state: [`ShardedReader`] checks the manifest against the piece files
//! on open, then hands out any element range of any unit's states, taking it from the
//! pieces that overlap it (seeking into their files) and verifying each piece it touches.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::ops::Range;
use std::path::{Path, PathBuf};

use crate::checksum::Checksum;
use crate::error::{Result, StateError};
use crate::fsio::{failed, is_plain_file_name};
use crate::sharded::{
    Piece, ShardedManifest, MANIFEST, OLDEST_SHARDED_VERSION, SHARDED_FORMAT, SHARDED_VERSION,
    TENSORS,
};

const CHUNK_ELEMS: usize = 1 << 16;

/// An open sharded state folder.
#[derive(Debug)]
pub struct ShardedReader {
    dir: PathBuf,
    manifest: ShardedManifest,
    by_tensor: PiecesByTensor,
}

/// Piece indices by (tensor-parallel rank, unit, tensor), sorted by `start`.
type PiecesByTensor = HashMap<(usize, usize, String), Vec<usize>>;

impl ShardedReader {
    /// Opens the state folder `dir` and checks, before reading any values: format and
    /// version, that every piece file exists with the length the manifest records, that
    /// the pieces of each file tile it, and that the pieces of each unit's tensor tile the
    /// unit's elements exactly.
    ///
    /// # Errors
    /// [`StateError::Io`] or [`StateError::Json`] for the manifest; [`StateError::BadState`] naming what
    /// is inconsistent; [`StateError::Tensor`] naming the file and a piece it should hold when a
    /// piece file is missing or truncated.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref().to_path_buf();
        let path = dir.join(MANIFEST);
        let bytes = std::fs::read(&path).map_err(failed("read", &path))?;
        let (manifest, by_tensor) = parse(&dir, &bytes)?;
        check_files(&dir, &manifest)?;
        Ok(Self {
            dir,
            manifest,
            by_tensor,
        })
    }

    /// The state folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The manifest.
    pub fn manifest(&self) -> &ShardedManifest {
        &self.manifest
    }

    /// Reads the `tensor` values of elements `range` of `unit` as tensor-parallel rank 0
    /// saved it (every unit at T = 1) into `out`: [`ShardedReader::read_tp_range`].
    ///
    /// # Errors
    /// As [`ShardedReader::read_tp_range`].
    pub fn read_range(
        &self,
        unit: usize,
        tensor: &str,
        range: Range<usize>,
        out: &mut [f32],
    ) -> Result<()> {
        self.read_tp_range(0, unit, tensor, range, out)
    }

    /// Reads the `tensor` values of elements `range` of `unit` as tensor-parallel rank
    /// `tp_rank` saved it into `out`. Every piece overlapping `range` is read in full
    /// through a fixed buffer, to verify its checksum; only the overlap is kept.
    ///
    /// # Errors
    /// [`StateError::Tensor`] for a range outside the unit, an `out` of another length, or
    /// a unit that rank did not save (a replicated unit above rank 0);
    /// [`StateError::ChecksumMismatch`] naming the file and piece; [`StateError::Io`].
    pub fn read_tp_range(
        &self,
        tp_rank: usize,
        unit: usize,
        tensor: &str,
        range: Range<usize>,
        out: &mut [f32],
    ) -> Result<()> {
        let numel = self.manifest.partitioning.units.get(unit).map(|u| u.numel);
        let fits = numel.is_some_and(|n| range.start <= range.end && range.end as u64 <= n);
        if !fits || out.len() != range.len() {
            return Err(StateError::Tensor {
                path: self.dir.clone(),
                name: format!("unit{unit}/{tensor}"),
                reason: format!(
                    "elements {}..{} into {} values are not inside the unit ({numel:?} elements)",
                    range.start,
                    range.end,
                    out.len()
                ),
            });
        }
        let key = (tp_rank, unit, tensor.to_string());
        let pieces = match self.by_tensor.get(&key) {
            Some(pieces) => pieces.as_slice(),
            None if range.is_empty() => &[],
            None => {
                return Err(StateError::Tensor {
                    path: self.dir.clone(),
                    name: format!("tp{tp_rank}/unit{unit}/{tensor}"),
                    reason: format!(
                        "tensor-parallel rank {tp_rank} saved no pieces of this unit (the state \
                         has T = {})",
                        self.manifest.partitioning.tensor_parallel
                    ),
                })
            }
        };
        let (lo, hi) = (range.start as u64, range.end as u64);
        for &i in pieces {
            let p = &self.manifest.pieces[i];
            let (start, end) = (p.start.max(lo), p.start.saturating_add(p.len).min(hi));
            if start < end {
                let into = &mut out[(start - lo) as usize..(end - lo) as usize];
                self.read_piece(p, start - p.start, into)?;
            }
        }
        Ok(())
    }

    /// Reads and verifies every piece (what `zero-train` does to check a state).
    ///
    /// # Errors
    /// As [`ShardedReader::read_range`].
    pub fn verify(&self) -> Result<()> {
        for p in &self.manifest.pieces {
            self.read_piece(p, 0, &mut [])?;
        }
        Ok(())
    }

    /// Streams piece `p` through its checksum, copying elements `skip..skip + into.len()`
    /// of it into `into`.
    fn read_piece(&self, p: &Piece, skip: u64, into: &mut [f32]) -> Result<()> {
        let path = self.dir.join(&p.file);
        let file = File::open(&path).map_err(failed("open", &path))?;
        let mut reader = BufReader::new(file);
        reader
            .seek(SeekFrom::Start(p.offset))
            .map_err(failed("seek", &path))?;
        let mut hash = Checksum::new();
        let mut buf = vec![0u8; CHUNK_ELEMS * 4];
        let (keep_from, keep_to) = (skip, skip + into.len() as u64);
        let mut at = 0u64;
        while at < p.len {
            let n = (p.len - at).min(CHUNK_ELEMS as u64);
            let bytes = &mut buf[..4 * n as usize];
            reader.read_exact(bytes).map_err(failed("read", &path))?;
            hash.update(bytes);
            let (from, to) = (at.max(keep_from), (at + n).min(keep_to));
            for e in from..to {
                let b = 4 * (e - at) as usize;
                let word = [bytes[b], bytes[b + 1], bytes[b + 2], bytes[b + 3]];
                into[(e - keep_from) as usize] = f32::from_bits(u32::from_le_bytes(word));
            }
            at += n;
        }
        let found = hash.finish();
        if found != p.checksum {
            return Err(StateError::ChecksumMismatch {
                path,
                name: p.name(),
                expected: p.checksum,
                found,
            });
        }
        Ok(())
    }
}

/// Parses the bytes of `dir`'s `manifest.json` and checks all [`ShardedReader::open`] checks
/// without the piece files: format, version, that every piece file's name stays in `dir`,
/// and that the pieces of each unit's tensor tile the unit's elements exactly.
///
/// # Errors
/// [`StateError::Json`] for what is not a manifest; [`StateError::BadState`] naming what is
/// inconsistent.
pub fn parse_manifest(dir: &Path, bytes: &[u8]) -> Result<ShardedManifest> {
    parse(dir, bytes).map(|(manifest, _)| manifest)
}

/// The manifest and its pieces by tensor (see [`parse_manifest`]).
fn parse(dir: &Path, bytes: &[u8]) -> Result<(ShardedManifest, PiecesByTensor)> {
    let path = dir.join(MANIFEST);
    let manifest: ShardedManifest =
        serde_json::from_slice(bytes).map_err(|source| StateError::Json { path, source })?;
    let bad = |reason: String| StateError::BadState {
        path: dir.to_path_buf(),
        reason,
    };
    if manifest.format != SHARDED_FORMAT {
        return Err(bad(format!(
            "format is {:?}, expected {SHARDED_FORMAT:?}",
            manifest.format
        )));
    }
    if !(OLDEST_SHARDED_VERSION..=SHARDED_VERSION).contains(&manifest.version) {
        return Err(bad(format!(
            "format version {} is not supported: this build reads versions \
             {OLDEST_SHARDED_VERSION} to {SHARDED_VERSION} (a newer zero-train wrote it?)",
            manifest.version
        )));
    }
    if let Some(f) = manifest.files.iter().find(|f| !is_plain_file_name(&f.name)) {
        return Err(bad(format!(
            "piece file {:?} is not a file name in the state folder",
            f.name
        )));
    }
    if let Some(p) = manifest
        .pieces
        .iter()
        .find(|p| !manifest.files.iter().any(|f| f.name == p.file))
    {
        return Err(bad(format!(
            "piece {} names an unlisted file {}",
            p.name(),
            p.file
        )));
    }
    let by_tensor = index_tensors(&manifest).map_err(bad)?;
    Ok((manifest, by_tensor))
}

/// Every piece file exists with its recorded length, and its pieces tile it.
fn check_files(dir: &Path, manifest: &ShardedManifest) -> Result<()> {
    for f in &manifest.files {
        let path = dir.join(&f.name);
        let mut mine: Vec<&Piece> = manifest
            .pieces
            .iter()
            .filter(|p| p.file == f.name)
            .collect();
        mine.sort_by_key(|p| p.offset);
        let first = mine.first().map_or_else(|| "(none)".into(), |p| p.name());
        let piece_err = |reason: String| StateError::Tensor {
            path: path.clone(),
            name: first.clone(),
            reason,
        };
        let len = std::fs::metadata(&path)
            .map_err(|e| piece_err(format!("piece file unreadable: {e}")))?
            .len();
        if len != f.bytes {
            return Err(piece_err(format!(
                "piece file has {len} bytes, the manifest says {} (truncated or overwritten)",
                f.bytes
            )));
        }
        let mut end = 0u64;
        for p in mine {
            let stop = p.len.checked_mul(4).and_then(|b| p.offset.checked_add(b));
            if p.dtype != "f32" || p.offset != end || stop.is_none_or(|s| s > len) {
                return Err(StateError::Tensor {
                    path: path.clone(),
                    name: p.name(),
                    reason: format!("dtype {:?} or extent outside or out of order", p.dtype),
                });
            }
            end = stop.unwrap_or(end);
        }
        if end != len {
            return Err(piece_err(format!("{} bytes belong to no piece", len - end)));
        }
    }
    Ok(())
}

/// Piece indices by (tensor-parallel rank, unit, tensor), after checking that each rank's
/// pieces of a unit's tensor tile `0..numel` exactly (no gap, no overlap): at rank 0 for
/// every unit, above it for the units it saved at all (the split ones).
fn index_tensors(manifest: &ShardedManifest) -> std::result::Result<PiecesByTensor, String> {
    let units = &manifest.partitioning.units;
    let t = manifest.partitioning.tensor_parallel;
    if t == 0 {
        return Err("tensor_parallel is 0".into());
    }
    let mut by_tensor = PiecesByTensor::new();
    for (i, p) in manifest.pieces.iter().enumerate() {
        if p.unit >= units.len() || !TENSORS.contains(&p.tensor.as_str()) || p.tp_rank >= t {
            return Err(format!(
                "piece {} belongs to no unit, tensor or tensor-parallel rank (T = {t})",
                p.name()
            ));
        }
        let key = (p.tp_rank, p.unit, p.tensor.clone());
        by_tensor.entry(key).or_default().push(i);
    }
    // The ranks that saved pieces, and rank 0, which saved every unit: a recorded T is
    // never looped over (a corrupt one could be any number).
    let ranks: std::collections::BTreeSet<usize> = std::iter::once(0)
        .chain(manifest.pieces.iter().map(|p| p.tp_rank))
        .collect();
    for tp_rank in ranks {
        for (unit, u) in units.iter().enumerate() {
            for tensor in TENSORS {
                let key = (tp_rank, unit, tensor.to_string());
                if tp_rank > 0 && !by_tensor.contains_key(&key) {
                    continue;
                }
                let list = by_tensor.entry(key).or_default();
                list.sort_by_key(|&i| manifest.pieces[i].start);
                check_tiling(manifest, list, u.numel)
                    .map_err(|e| format!("tp{tp_rank}/unit{unit}/{tensor}: {e}"))?;
            }
        }
    }
    Ok(by_tensor)
}

/// The pieces `list` (sorted by start) tile `0..numel`.
fn check_tiling(
    manifest: &ShardedManifest,
    list: &[usize],
    numel: u64,
) -> std::result::Result<(), String> {
    let mut end = 0u64;
    for &i in list {
        let p = &manifest.pieces[i];
        if p.start != end {
            return Err(format!(
                "piece {} does not start where the last ended ({end})",
                p.name()
            ));
        }
        end = (p.start.checked_add(p.len))
            .ok_or_else(|| format!("piece {} ends past 2^64", p.name()))?;
    }
    if end != numel {
        return Err(format!("pieces cover {end} of {numel} elements"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_manifest;
    use std::path::Path;

    /// A manifest of one unit of `numel` elements whose three tensors are each the pieces
    /// `(start, len)` of `pieces`, all in one listed file.
    fn manifest(numel: u64, pieces: &[(u64, u64)], file: &str) -> String {
        let pieces: Vec<serde_json::Value> = ["params", "adam_m", "adam_v"]
            .iter()
            .flat_map(|tensor| {
                pieces.iter().map(move |&(start, len)| {
                    serde_json::json!({"file": file, "unit": 0, "tensor": tensor, "dtype": "f32",
                        "start": start, "len": len, "offset": 0, "checksum": 0})
                })
            })
            .collect();
        serde_json::json!({
            "format": "zero-train-sharded-state", "version": 1, "step": 0, "meta": {},
            "partitioning": {"world": 1, "stage": 0, "precision": "fp32", "units": [
                {"numel": numel, "padded_numel": numel, "shard_len": numel, "owned": [[0, numel]]}
            ]},
            "files": [{"name": "rank-00000.bin", "bytes": 0}],
            "pieces": pieces,
        })
        .to_string()
    }

    fn parse(text: &str) -> Result<(), String> {
        parse_manifest(Path::new("s"), text.as_bytes())
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn pieces_that_tile_a_unit_parse() {
        assert_eq!(
            parse(&manifest(10, &[(0, 4), (4, 6)], "rank-00000.bin")),
            Ok(())
        );
    }

    #[test]
    fn a_piece_that_ends_past_u64_is_refused_not_taken_to_cover_the_rest() {
        let err = parse(&manifest(
            u64::MAX,
            &[(0, 5), (5, u64::MAX)],
            "rank-00000.bin",
        ));
        assert!(
            err.as_ref().is_err_and(|e| e.contains("past 2^64")),
            "{err:?}"
        );
    }

    /// `manifest`'s, at tensor-parallel size `t`, with a copy of its pieces for each
    /// `tp_rank` in `extra` (as a block slice is saved by every rank of the group).
    fn at_tp(text: &str, t: usize, extra: &[usize]) -> String {
        let mut m: serde_json::Value = serde_json::from_str(text).unwrap();
        m["version"] = 2.into();
        m["partitioning"]["tensor_parallel"] = t.into();
        let base = m["pieces"].as_array().unwrap().clone();
        for &tp in extra {
            for mut p in base.clone() {
                p["tp_rank"] = tp.into();
                m["pieces"].as_array_mut().unwrap().push(p);
            }
        }
        m.to_string()
    }

    #[test]
    fn each_tensor_parallel_rank_tiles_the_units_it_saved_and_no_rank_is_past_t() {
        let one = manifest(10, &[(0, 4), (4, 6)], "rank-00000.bin");
        assert_eq!(parse(&at_tp(&one, 2, &[1])), Ok(()));
        // Rank 1 saved no pieces of the unit: a replicated unit, which rank 0 holds.
        assert_eq!(parse(&at_tp(&one, 2, &[])), Ok(()));
        let past = parse(&at_tp(&one, 2, &[2]));
        assert!(
            past.as_ref()
                .is_err_and(|e| e.contains("tensor-parallel rank")),
            "{past:?}"
        );
        let gap = manifest(10, &[(0, 4)], "rank-00000.bin");
        let mut m: serde_json::Value = serde_json::from_str(&at_tp(&one, 2, &[])).unwrap();
        let gapped: serde_json::Value = serde_json::from_str(&gap).unwrap();
        for mut p in gapped["pieces"].as_array().unwrap().clone() {
            p["tp_rank"] = 1.into();
            m["pieces"].as_array_mut().unwrap().push(p);
        }
        let err = parse(&m.to_string());
        assert!(
            err.as_ref().is_err_and(|e| e.contains("tp1/unit0")),
            "{err:?}"
        );
    }

    #[test]
    fn a_piece_in_an_unlisted_or_escaping_file_is_refused() {
        for file in ["other.bin", "../rank-00000.bin"] {
            let err = parse(&manifest(10, &[(0, 10)], file));
            assert!(
                err.as_ref().is_err_and(|e| e.contains("unlisted file")),
                "{err:?}"
            );
        }
    }
}
