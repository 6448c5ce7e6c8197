//! One file in: a Hugging Face GPT-2 safetensors file read into the model's unit buffers.
//!
//! The model's shape comes from the file: V and C from `wte` (V, C), maxT from `wpe`, L from
//! the highest `h.N`; the head count is in no tensor, so it comes from a `config.json`
//! beside the file or from the caller. Accepted as HF writes them: names with or without
//! the `transformer.` prefix, the causal-mask buffers `h.N.attn.bias` /
//! `h.N.attn.masked_bias` and a tied `lm_head.weight` (all ignored), F32, BF16 or F16 data.
//! Every tensor is checked (present, shape, extent) before any unit memory is allocated.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Cursor, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use zero_gpt::{GptConfig, GptError, ParamLayout};

use super::error::{CheckpointError, Result, SafetensorsError};
use super::hf::{hf_tensors, parse_hf_dims, HfDims, HfTensor};
use super::layout::ModelShape;
use super::safetensors::{read_header, Entry, ReadFail};
use crate::fsio::failed;

/// Bytes read per call while decoding a tensor.
const CHUNK_BYTES: usize = 1 << 18;

const PREFIX: &str = "transformer.";

/// Reads a GPT-2 safetensors file (see the module documentation) into unit buffers in the
/// model's layout ([`ParamLayout::unit_lens`]; the padded vocabulary rows are zero).
///
/// The head count is `n_head` when given, else `n_head` of the `config.json` in the same
/// directory. A `config.json` that is present must agree with the tensors.
///
/// # Errors
/// [`CheckpointError::Safetensors`] naming the file, and the tensor where one is at fault: truncated
/// file, corrupt header, unsupported dtype, missing, unexpected or wrongly shaped tensor,
/// no head count, a model the model refuses; [`CheckpointError::Io`] when reading fails.
pub fn read_safetensors(
    path: impl AsRef<Path>,
    n_head: Option<usize>,
) -> Result<(GptConfig, Vec<Vec<f32>>)> {
    with_file(path.as_ref(), |r, len, dims| {
        read_model(r, len, n_head, dims)
    })
}

/// The model a GPT-2 safetensors file holds, from its header (and the `config.json` beside
/// it) alone: no tensor data is read. The head count is found as in [`read_safetensors`].
///
/// # Errors
/// As [`read_safetensors`], for the header's faults.
pub fn safetensors_config(path: impl AsRef<Path>, n_head: Option<usize>) -> Result<GptConfig> {
    with_file(path.as_ref(), |r, len, dims| {
        let header = read_header(r, len)?;
        Ok(infer_config_of(
            located(header.entries, 0),
            n_head.or(dims.n_head),
            dims,
        )?)
    })
}

/// Opens `path` and its `config.json` sidecar, runs `read` on them, and names the file in
/// any error.
fn with_file<T>(
    path: &Path,
    read: impl FnOnce(&mut BufReader<File>, u64, HfDims) -> Result<T, ReadFail>,
) -> Result<T> {
    let dims = sidecar_dims(path)?;
    let (mut reader, len) = open(path)?;
    read(&mut reader, len, dims).map_err(|e| file_error(path, e))
}

/// The dimensions the `config.json` beside `path` states (none when there is no such file).
///
/// # Errors
/// [`CheckpointError::Io`] when it exists but cannot be read; [`SafetensorsError::BadConfig`] when
/// it does not parse.
pub(super) fn sidecar_dims(path: &Path) -> Result<HfDims> {
    let config_path = path.with_file_name("config.json");
    match std::fs::read(&config_path) {
        Ok(text) => parse_hf_dims(&text).map_err(|reason| CheckpointError::Safetensors {
            path: path.to_path_buf(),
            source: SafetensorsError::BadConfig { reason },
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(HfDims::default()),
        Err(source) => Err(failed("read", &config_path)(source).into()),
    }
}

/// `path` opened for buffered reading, and its length.
pub(super) fn open(path: &Path) -> Result<(BufReader<File>, u64)> {
    let file = File::open(path).map_err(failed("open", path))?;
    let len = file.metadata().map_err(failed("stat", path))?.len();
    Ok((BufReader::new(file), len))
}

/// A read failure of the file at `path` as the module's error, naming the file.
pub(super) fn file_error(path: &Path, e: ReadFail) -> CheckpointError {
    match e {
        ReadFail::Io(source) => failed("read", path)(source).into(),
        ReadFail::Format(source) => CheckpointError::Safetensors {
            path: path.to_path_buf(),
            source,
        },
    }
}

/// [`read_safetensors`] on bytes in memory, with the head count given (the fuzz target's
/// entry point).
///
/// # Errors
/// As [`read_safetensors`], with path `<memory>`.
pub fn read_safetensors_bytes(bytes: &[u8], n_head: usize) -> Result<(GptConfig, Vec<Vec<f32>>)> {
    let path = PathBuf::from("<memory>");
    read_model(
        &mut Cursor::new(bytes),
        bytes.len() as u64,
        Some(n_head),
        HfDims::default(),
    )
    .map_err(|e| file_error(&path, e))
}

fn read_model<R: Read + Seek>(
    r: &mut R,
    len: u64,
    n_head: Option<usize>,
    dims: HfDims,
) -> Result<(GptConfig, Vec<Vec<f32>>), ReadFail> {
    let header = read_header(r, len)?;
    let mut parts = [Part {
        reader: r,
        data_start: header.data_start,
    }];
    assemble(
        &mut parts,
        located(header.entries, 0),
        n_head.or(dims.n_head),
        dims,
    )
    .map_err(|e| match e {
        AssembleFail::Model(e) => ReadFail::Format(e),
        AssembleFail::File(_, e) => e,
    })
}

/// Where one tensor's bytes are: which of the model's files (its index in the parts), and
/// its entry in that file's header.
#[derive(Debug, Clone)]
pub(super) struct Located {
    pub(super) file: usize,
    pub(super) entry: Entry,
}

/// The entries of file `file`'s header, located.
pub(super) fn located(entries: HashMap<String, Entry>, file: usize) -> HashMap<String, Located> {
    entries
        .into_iter()
        .map(|(name, entry)| (name, Located { file, entry }))
        .collect()
}

/// One file of a model, open: its reader and where its data starts.
pub(super) struct Part<R> {
    pub(super) reader: R,
    pub(super) data_start: u64,
}

/// What failed while assembling a model: the tensors as a whole, or one file's bytes.
pub(super) enum AssembleFail {
    Model(SafetensorsError),
    File(usize, ReadFail),
}

/// The model the located tensors describe, read into unit buffers in the model's layout
/// (the padded vocabulary rows zero), after checking every tensor (present, shape, none
/// extra) and before allocating any unit.
pub(super) fn assemble<R: Read + Seek>(
    parts: &mut [Part<R>],
    raw: HashMap<String, Located>,
    heads: Option<usize>,
    dims: HfDims,
) -> Result<(GptConfig, Vec<Vec<f32>>), AssembleFail> {
    let entries = gpt_entries(raw).map_err(AssembleFail::Model)?;
    let config = infer_config(&entries, heads, dims).map_err(AssembleFail::Model)?;
    let tensors = hf_tensors(&config);
    check_tensors(&entries, &tensors).map_err(AssembleFail::Model)?;
    // Every tensor's bytes were checked to lie in its file without overlap, so the units
    // (these tensors plus at most 127 padded rows) are bounded by the files' sizes.
    let mut units: Vec<Vec<f32>> = ParamLayout::new(&config)
        .unit_lens()
        .into_iter()
        .map(|n| vec![0.0; n])
        .collect();
    for t in &tensors {
        let (Some(at), Some(unit)) = (entries.get(&t.name), units.get_mut(t.unit)) else {
            continue;
        };
        let fail = |e| AssembleFail::File(at.file, e);
        let files = parts.len();
        let part = parts.get_mut(at.file).ok_or_else(|| {
            fail(ReadFail::Format(SafetensorsError::BadEntry {
                tensor: t.name.clone(),
                reason: format!("in file {} of {files}", at.file),
            }))
        })?;
        read_tensor(&mut part.reader, part.data_start, &at.entry, t, unit).map_err(fail)?;
    }
    Ok((config, units))
}

/// The model the located tensors describe, from their names and shapes alone.
pub(super) fn infer_config_of(
    raw: HashMap<String, Located>,
    heads: Option<usize>,
    dims: HfDims,
) -> Result<GptConfig, SafetensorsError> {
    infer_config(&gpt_entries(raw)?, heads, dims)
}

/// Every tensor of the model present with its shape, and nothing else.
fn check_tensors(
    entries: &HashMap<String, Located>,
    tensors: &[HfTensor],
) -> Result<(), SafetensorsError> {
    for t in tensors {
        let e = entries
            .get(&t.name)
            .ok_or_else(|| SafetensorsError::MissingTensor {
                tensor: t.name.clone(),
            })?;
        if e.entry.shape != t.shape {
            return Err(SafetensorsError::WrongShape {
                tensor: t.name.clone(),
                expected: t.shape.clone(),
                got: e.entry.shape.clone(),
            });
        }
    }
    match entries
        .keys()
        .find(|n| !tensors.iter().any(|t| &t.name == *n))
    {
        Some(extra) => Err(SafetensorsError::UnexpectedTensor {
            tensor: extra.clone(),
        }),
        None => Ok(()),
    }
}

/// The GPT-2 entries under their prefixed names, without the ignored buffers.
fn gpt_entries<V>(raw: HashMap<String, V>) -> Result<HashMap<String, V>, SafetensorsError> {
    let mut out = HashMap::with_capacity(raw.len());
    for (name, entry) in raw {
        let bare = name.strip_prefix(PREFIX).unwrap_or(&name);
        let is_mask = bare.strip_prefix("h.").is_some_and(|rest| {
            rest.split_once('.').is_some_and(|(layer, what)| {
                layer.bytes().all(|b| b.is_ascii_digit())
                    && matches!(what, "attn.bias" | "attn.masked_bias")
            })
        });
        if is_mask || name == "lm_head.weight" {
            continue;
        }
        let full = format!("{PREFIX}{bare}");
        if out.insert(full.clone(), entry).is_some() {
            return Err(SafetensorsError::BadEntry {
                tensor: full,
                reason: "present both with and without the transformer. prefix".into(),
            });
        }
    }
    Ok(out)
}

/// The model the tensors describe, checked against `config.json`'s dimensions.
fn infer_config(
    entries: &HashMap<String, Located>,
    heads: Option<usize>,
    dims: HfDims,
) -> Result<GptConfig, SafetensorsError> {
    let two_d = |name: &str| -> Result<(usize, usize), SafetensorsError> {
        let full = format!("{PREFIX}{name}");
        match entries.get(&full).map(|e| &e.entry.shape[..]) {
            None => Err(SafetensorsError::MissingTensor { tensor: full }),
            Some(&[a, b]) => Ok((a, b)),
            Some(other) => Err(SafetensorsError::BadEntry {
                tensor: full,
                reason: format!("shape {other:?} is not 2-D"),
            }),
        }
    };
    let (vocab, channels) = two_d("wte.weight")?;
    let (positions, _) = two_d("wpe.weight")?;
    let layers = count_layers(entries)?;
    let heads = heads.ok_or(SafetensorsError::MissingHeads)?;
    let stated = [
        ("n_embd", dims.n_embd, channels),
        ("n_layer", dims.n_layer, layers),
        ("n_positions", dims.n_positions, positions),
        ("vocab_size", dims.vocab_size, vocab),
        ("n_head", dims.n_head, heads),
    ];
    for (field, said, found) in stated {
        if let Some(said) = said.filter(|&s| s != found) {
            return Err(SafetensorsError::BadConfig {
                reason: format!("{field} is {said} but the model has {found}"),
            });
        }
    }
    let config =
        GptConfig::new(positions, vocab, layers, heads, channels).map_err(|e| match e {
            GptError::InvalidConfig {
                field,
                value,
                reason,
            } => SafetensorsError::InvalidModel {
                field,
                value,
                reason,
            },
            other => SafetensorsError::CorruptHeader {
                reason: other.to_string(),
            },
        })?;
    // The layout's sums are unchecked; this bound makes them safe whatever the shapes say.
    ModelShape::from_config(&config)
        .validate()
        .map_err(|e| SafetensorsError::CorruptHeader {
            reason: e.to_string(),
        })?;
    Ok(config)
}

/// L: one past the highest `h.N`, once every layer below it is seen to exist.
fn count_layers<V>(entries: &HashMap<String, V>) -> Result<usize, SafetensorsError> {
    let indices: std::collections::BTreeSet<usize> = entries
        .keys()
        .filter_map(|n| {
            n.strip_prefix("transformer.h.")?
                .split_once('.')?
                .0
                .parse()
                .ok()
        })
        .collect();
    // The first absent index; bounded by the number present, however large their values.
    let missing = (0..=indices.len())
        .find(|i| !indices.contains(i))
        .unwrap_or(0);
    if missing < indices.len() {
        return Err(SafetensorsError::MissingTensor {
            tensor: format!("{PREFIX}h.{missing}.ln_1.weight"),
        });
    }
    Ok(indices.len())
}

/// Reads one tensor's data into its unit, undoing HF's (in, out) transposition.
fn read_tensor<R: Read + Seek>(
    r: &mut R,
    data_start: u64,
    e: &Entry,
    t: &HfTensor,
    unit: &mut [f32],
) -> Result<(), ReadFail> {
    // data_start + begin <= the file's length, checked with the header.
    r.seek(SeekFrom::Start(data_start + e.begin))
        .map_err(ReadFail::Io)?;
    let size = e.dtype.size();
    let (rows, cols) = (t.rows, t.cols);
    let mut remaining = t.len() * size;
    let mut buf = vec![0u8; CHUNK_BYTES.min(remaining)];
    let mut k = 0;
    while remaining > 0 {
        let want = remaining.min(buf.len());
        r.read_exact(&mut buf[..want]).map_err(ReadFail::Io)?;
        for bytes in buf[..want].chunks_exact(size) {
            // File element k of a transposed (cols, rows) tensor is the model's (k % rows, k / rows).
            let at = if t.transposed {
                (k % rows) * cols + k / rows
            } else {
                k
            };
            unit[t.offset + at] = e.dtype.decode(bytes);
            k += 1;
        }
        remaining -= want;
    }
    Ok(())
}
