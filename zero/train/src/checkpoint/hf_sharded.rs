//! Hugging Face's sharded safetensors checkpoints: `model.safetensors.index.json` maps every
//! tensor name to one of the shard files beside it (`model-00001-of-00002.safetensors`, ...),
//! as `save_pretrained` writes a model above its shard size (GPT-2 XL in float32 is 6.4 GB,
//! above the default 5 GB).
//!
//! The index and the shards' headers must agree exactly: every tensor a shard holds is
//! mapped to that shard, and every mapped tensor is in its shard. Shards are plain file
//! names in the index's folder (no path separators, no `..`). The model is then assembled
//! as from one file (`hf_import`): same names, shapes, dtypes and checks, each tensor read
//! from its shard.

use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use zero_gpt::GptConfig;

use super::error::{CheckpointError, Result, SafetensorsError};
use super::hf::HfDims;
use super::hf_import::{
    assemble, file_error, infer_config_of, located, open, sidecar_dims, AssembleFail, Located, Part,
};
use super::safetensors::{read_header, MAX_HEADER_BYTES};
use crate::fsio::{failed, is_plain_file_name};

/// The index file's name in a Hugging Face model folder.
pub const HF_INDEX_FILE: &str = "model.safetensors.index.json";

/// The shards of one checkpoint, open, and every tensor located in them.
struct Shards {
    paths: Vec<PathBuf>,
    parts: Vec<Part<BufReader<File>>>,
    tensors: HashMap<String, Located>,
    dims: HfDims,
}

/// Reads the sharded GPT-2 checkpoint whose index is at `index` into unit buffers in the
/// model's layout, as `read_safetensors` does for one file.
///
/// # Errors
/// [`CheckpointError::Safetensors`] naming the index (a bad index, a missing or extra tensor, a wrong
/// shape) or the shard at fault (its header, a truncated tensor); [`CheckpointError::Io`] naming the
/// file that cannot be read.
pub fn read_sharded_safetensors(
    index: impl AsRef<Path>,
    n_head: Option<usize>,
) -> Result<(GptConfig, Vec<Vec<f32>>)> {
    let index = index.as_ref();
    let mut shards = open_shards(index)?;
    let heads = n_head.or(shards.dims.n_head);
    assemble(&mut shards.parts, shards.tensors, heads, shards.dims).map_err(|e| match e {
        AssembleFail::Model(source) => index_error(index, source),
        AssembleFail::File(i, e) => file_error(shards.paths.get(i).map_or(index, |p| p), e),
    })
}

/// The model a sharded checkpoint holds, from its index and the shards' headers alone.
///
/// # Errors
/// As [`read_sharded_safetensors`], for the index's and headers' faults.
pub fn sharded_safetensors_config(
    index: impl AsRef<Path>,
    n_head: Option<usize>,
) -> Result<GptConfig> {
    let index = index.as_ref();
    let shards = open_shards(index)?;
    infer_config_of(shards.tensors, n_head.or(shards.dims.n_head), shards.dims)
        .map_err(|e| index_error(index, e))
}

fn index_error(index: &Path, source: SafetensorsError) -> CheckpointError {
    CheckpointError::Safetensors {
        path: index.to_path_buf(),
        source,
    }
}

fn bad_index(index: &Path, reason: String) -> CheckpointError {
    index_error(index, SafetensorsError::BadIndex { reason })
}

/// Reads the index, opens every shard it names and checks their headers against it.
fn open_shards(index: &Path) -> Result<Shards> {
    let weight_map = read_weight_map(index)?;
    let names: BTreeSet<&str> = weight_map.values().map(String::as_str).collect();
    let folder = index.parent().unwrap_or(Path::new(""));
    let mut shards = Shards {
        paths: Vec::new(),
        parts: Vec::new(),
        tensors: HashMap::new(),
        dims: sidecar_dims(index)?,
    };
    for (file, name) in names.into_iter().enumerate() {
        let path = folder.join(name);
        let (mut reader, len) = open(&path)?;
        let header = read_header(&mut reader, len).map_err(|e| file_error(&path, e))?;
        for tensor in header.entries.keys() {
            let mapped = weight_map.get(tensor).map(String::as_str);
            if mapped != Some(name) {
                let to = mapped.map_or("nowhere".to_string(), |m| format!("to {m}"));
                let why = format!("{name} holds {tensor}, which the index maps {to}");
                return Err(bad_index(index, why));
            }
        }
        shards.tensors.extend(located(header.entries, file));
        shards.paths.push(path);
        shards.parts.push(Part {
            reader,
            data_start: header.data_start,
        });
    }
    if let Some((tensor, shard)) = weight_map
        .iter()
        .find(|(t, _)| !shards.tensors.contains_key(*t))
    {
        let why = format!("maps {tensor} to {shard}, which does not hold it");
        return Err(bad_index(index, why));
    }
    Ok(shards)
}

/// The `weight_map` of the index file at `index` ([`parse_hf_index`]).
fn read_weight_map(index: &Path) -> Result<HashMap<String, String>> {
    let mut text = Vec::new();
    File::open(index)
        .map_err(failed("open", index))?
        .take(MAX_HEADER_BYTES + 1)
        .read_to_end(&mut text)
        .map_err(failed("read", index))?;
    parse_hf_index(&text).map_err(|source| index_error(index, source))
}

/// The `weight_map` of an index's bytes: tensor name to shard file name, each shard a plain
/// file name (no separator, not `.` or `..`), the text at most 100 MB (the fuzz target's
/// entry point).
///
/// # Errors
/// [`SafetensorsError::BadIndex`] saying what is wrong.
pub fn parse_hf_index(text: &[u8]) -> Result<HashMap<String, String>, SafetensorsError> {
    let bad = |reason: String| SafetensorsError::BadIndex { reason };
    if text.len() as u64 > MAX_HEADER_BYTES {
        return Err(bad(format!("longer than {MAX_HEADER_BYTES} bytes")));
    }
    #[derive(serde::Deserialize)]
    struct IndexFile {
        weight_map: HashMap<String, String>,
    }
    let parsed: IndexFile =
        serde_json::from_slice(text).map_err(|e| bad(format!("not a weight_map index: {e}")))?;
    if let Some(name) = parsed.weight_map.values().find(|s| !is_plain_file_name(s)) {
        return Err(bad(format!(
            "shard {name:?} is not a file name in the index's folder"
        )));
    }
    Ok(parsed.weight_map)
}
