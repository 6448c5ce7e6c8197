//! Hugging Face's sharded layout out, as `save_pretrained(max_shard_size=...)` writes it.
//!
//! HF's tensors, in unit order, are cut into runs of at most `max_shard_bytes` each. A tensor
//! larger than that gets a shard of its own, as HF does. Each run becomes
//! `model-0000i-of-0000n.safetensors`, and `model.safetensors.index.json` maps every tensor
//! name to its shard, with the data's total size. A model that fits one shard is written as
//! HF writes it then: `model.safetensors`, with no index.
//!
//! A folder that already holds a model (an index, `model.safetensors` or a shard) is refused:
//! a reader would take its index or single file for the new export. Shards are written first,
//! each atomically; the index goes last, so a reader never finds an index naming a shard that
//! is not there. When any write fails, the shards already written are removed (the folder
//! stays). Units are taken one at a time, as for one file (`hf_export`).

use std::io::Write;
use std::ops::Range;
use std::path::{Path, PathBuf};

use serde_json::json;
use zero_gpt::GptConfig;

use super::error::{CheckpointError, Result};
use super::hf::HfTensor;
use super::hf_export::{checked_tensors, write_tensors_file, SafetensorsDtype, UnitCursor};
use super::hf_sharded::HF_INDEX_FILE;
use crate::fsio::failed;

/// The file name HF gives a single-file model.
pub const HF_SINGLE_FILE: &str = "model.safetensors";

/// Writes the parameters into the folder `dir` (created if missing) as HF's sharded
/// safetensors of at most `max_shard_bytes` of tensor data per shard; returns the files
/// written, the index last (or the one `model.safetensors`).
///
/// # Errors
/// As [`export_safetensors`](super::export_safetensors); [`CheckpointError::ModelFolderInUse`] for a
/// folder that holds a model already; [`CheckpointError::Io`] naming the folder or file that could not
/// be read or written. No model file is left behind on failure.
pub fn export_sharded_safetensors<U: AsRef<[f32]>>(
    config: &GptConfig,
    units: impl IntoIterator<Item = U>,
    dtype: SafetensorsDtype,
    dir: &Path,
    max_shard_bytes: u64,
) -> Result<Vec<PathBuf>> {
    let tensors = checked_tensors(config)?;
    let runs = plan_shards(&tensors, dtype, max_shard_bytes);
    let names: Vec<String> = if runs.len() == 1 {
        vec![HF_SINGLE_FILE.into()]
    } else {
        (0..runs.len()).map(|i| shard_name(i, runs.len())).collect()
    };
    std::fs::create_dir_all(dir).map_err(failed("create the folder", dir))?;
    if let Some(found) = model_file_in(dir).map_err(failed("list", dir))? {
        return Err(CheckpointError::ModelFolderInUse {
            path: dir.to_path_buf(),
            found,
        });
    }
    let mut cursor = UnitCursor::new(config, units);
    let mut written = Vec::with_capacity(runs.len() + 1);
    for (i, run) in runs.iter().enumerate() {
        // Pushed first: a write that fails after its rename (syncing the folder) leaves it.
        written.push(dir.join(&names[i]));
        let last = i + 1 == runs.len();
        let path = &written[i];
        if let Err(e) = write_tensors_file(&tensors[run.clone()], dtype, &mut cursor, path, last) {
            remove_all(&written);
            return Err(e);
        }
    }
    if runs.len() > 1 {
        let index = dir.join(HF_INDEX_FILE);
        let text = index_json(&tensors, &runs, &names, dtype);
        if let Err(e) = crate::fsio::write_atomic(&index, |w| w.write_all(&text)) {
            remove_all(&written);
            return Err(e.into());
        }
        written.push(index);
    }
    Ok(written)
}

/// The name of a Hugging Face model file `dir` holds (an index, `model.safetensors` or a
/// shard), if any.
fn model_file_in(dir: &Path) -> std::io::Result<Option<String>> {
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        let shard = name.starts_with("model-") && name.ends_with(".safetensors");
        if shard || name == HF_SINGLE_FILE || name == HF_INDEX_FILE {
            return Ok(Some(name));
        }
    }
    Ok(None)
}

/// HF's name of shard `i` (from 0) of `n`.
pub fn shard_name(i: usize, n: usize) -> String {
    format!("model-{:05}-of-{n:05}.safetensors", i + 1)
}

/// Consecutive runs of `tensors` of at most `max_bytes` of data each; a tensor above the
/// bound alone in its run.
fn plan_shards(tensors: &[HfTensor], dtype: SafetensorsDtype, max_bytes: u64) -> Vec<Range<usize>> {
    let mut runs = Vec::new();
    let (mut start, mut bytes) = (0, 0u64);
    for (i, t) in tensors.iter().enumerate() {
        let size = tensor_bytes(t, dtype);
        if i > start && bytes.saturating_add(size) > max_bytes {
            runs.push(start..i);
            (start, bytes) = (i, 0);
        }
        bytes = bytes.saturating_add(size);
    }
    if start < tensors.len() {
        runs.push(start..tensors.len());
    }
    runs
}

fn tensor_bytes(t: &HfTensor, dtype: SafetensorsDtype) -> u64 {
    (t.len() as u64).saturating_mul(dtype.size() as u64)
}

/// The index: the data's total size and each tensor's shard.
fn index_json(
    tensors: &[HfTensor],
    runs: &[Range<usize>],
    names: &[String],
    dtype: SafetensorsDtype,
) -> Vec<u8> {
    let mut map = serde_json::Map::new();
    for (run, name) in runs.iter().zip(names) {
        for t in &tensors[run.clone()] {
            map.insert(t.name.clone(), json!(name));
        }
    }
    let total: u64 = tensors.iter().map(|t| tensor_bytes(t, dtype)).sum();
    let index = json!({ "metadata": { "total_size": total }, "weight_map": map });
    // A map of strings and numbers always serializes.
    serde_json::to_vec_pretty(&index).unwrap_or_default()
}

/// Best effort: the export already failed, and that is the error worth reporting.
fn remove_all(paths: &[PathBuf]) {
    for p in paths {
        let _ = std::fs::remove_file(p);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(len: usize) -> HfTensor {
        HfTensor {
            name: format!("t{len}"),
            unit: 0,
            offset: 0,
            rows: len,
            cols: 1,
            transposed: false,
            shape: vec![len],
        }
    }

    /// Runs, by a naive rule: a run closes before the tensor that would take it past the
    /// bound, unless the run is empty.
    #[test]
    fn shards_cover_every_tensor_once_in_order_within_the_bound() {
        let lens = [3, 5, 2, 9, 1, 1, 4];
        let tensors: Vec<HfTensor> = lens.iter().map(|&n| tensor(n)).collect();
        let f32_runs = |max| plan_shards(&tensors, SafetensorsDtype::F32, max);
        // 4-byte elements, at most 24 bytes (6 elements): [3], [5], [2], [9 alone], [1,1,4].
        assert_eq!(f32_runs(24), vec![0..1, 1..2, 2..3, 3..4, 4..7]);
        // 40 bytes (10 elements): [3,5,2], [9,1], [1,4].
        assert_eq!(f32_runs(40), vec![0..3, 3..5, 5..7]);
        assert_eq!(f32_runs(u64::MAX), vec![0..7]);
        assert_eq!(f32_runs(0), (0..7).map(|i| i..i + 1).collect::<Vec<_>>());
    }

    #[test]
    fn shard_names_are_hugging_faces() {
        assert_eq!(shard_name(0, 3), "model-00001-of-00003.safetensors");
        assert_eq!(shard_name(2, 3), "model-00003-of-00003.safetensors");
    }
}
