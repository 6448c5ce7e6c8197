//! One file out: the model as a single safetensors file with the tensor names and layouts
//! of Hugging Face's GPT-2 checkpoint, plus its `config.json`.
//!
//! safetensors is an 8-byte little-endian header length N, N bytes of JSON (per tensor its
//! dtype, shape and `data_offsets` [begin, end) into the data), then the data. The writer is
//! written here rather than taken from the `safetensors` crate because the crate's
//! `serialize_to_file` wants every tensor's bytes as a view up front, while this writer
//! takes one unit at a time (a ZeRO-3 run gathers one unit, writes it, releases it): the
//! header is known from the config alone, so the data can stream behind it. Memory beyond
//! the header and one caller's unit is one 256 KiB encoding buffer.

use std::io::Write;
use std::path::Path;

use serde_json::json;
use zero_gpt::GptConfig;

use super::error::{CheckpointError, Result};
use super::hf::{hf_config_json, hf_tensors, HfTensor};
use super::layout::ModelShape;

/// Elements encoded per write.
const CHUNK_ELEMS: usize = 1 << 16;

/// Element type of an exported file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SafetensorsDtype {
    /// IEEE float32, bit-exact with the model's parameters.
    F32,
    /// bfloat16, rounded to nearest even from float32.
    Bf16,
}

impl SafetensorsDtype {
    /// The name in a safetensors header (`F32`, `BF16`).
    pub fn header_name(self) -> &'static str {
        match self {
            Self::F32 => "F32",
            Self::Bf16 => "BF16",
        }
    }

    /// PyTorch's name, as `config.json`'s `torch_dtype` records it.
    pub fn torch_name(self) -> &'static str {
        match self {
            Self::F32 => "float32",
            Self::Bf16 => "bfloat16",
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::Bf16 => 2,
        }
    }

    fn put(self, x: f32, out: &mut Vec<u8>) {
        match self {
            Self::F32 => out.extend_from_slice(&x.to_le_bytes()),
            Self::Bf16 => out.extend_from_slice(&half::bf16::from_f32(x).to_le_bytes()),
        }
    }
}

/// The header: its JSON, padded with spaces to a multiple of 8 bytes as the reference
/// writer does, so the data that follows is aligned.
fn header_json(tensors: &[HfTensor], dtype: SafetensorsDtype) -> Result<Vec<u8>> {
    let mut map = serde_json::Map::new();
    // transformers refuses a file without metadata format "pt".
    map.insert("__metadata__".into(), json!({ "format": "pt" }));
    let mut at = 0usize;
    for t in tensors {
        // The shape was validated with a byte bound, so these sums cannot overflow.
        let end = at + t.len() * dtype.size();
        map.insert(
            t.name.clone(),
            json!({ "dtype": dtype.header_name(), "shape": t.shape, "data_offsets": [at, end] }),
        );
        at = end;
    }
    let mut bytes = serde_json::to_vec(&map).map_err(|source| CheckpointError::Json {
        path: "<safetensors header>".into(),
        source,
    })?;
    bytes.resize(bytes.len().next_multiple_of(8), b' ');
    Ok(bytes)
}

/// Writes one tensor from its unit, transposing HF's `Conv1D` weights to (in, out).
fn write_tensor(
    w: &mut impl Write,
    t: &HfTensor,
    unit: &[f32],
    dtype: SafetensorsDtype,
    scratch: &mut Vec<u8>,
) -> std::io::Result<()> {
    let (rows, cols, at) = (t.rows, t.cols, t.offset);
    let values: Box<dyn Iterator<Item = f32>> = if t.transposed {
        // File element (i, j) of the (cols, rows) tensor is the model's (j, i).
        Box::new((0..cols).flat_map(move |i| (0..rows).map(move |j| unit[at + j * cols + i])))
    } else {
        Box::new(unit[at..at + t.len()].iter().copied())
    };
    scratch.clear();
    for x in values {
        dtype.put(x, scratch);
        if scratch.len() >= CHUNK_ELEMS * dtype.size() {
            w.write_all(scratch)?;
            scratch.clear();
        }
    }
    w.write_all(scratch)
}

/// Writes the parameters as one safetensors file in Hugging Face GPT-2's names and layouts
/// (see the module documentation), atomically and durably.
///
/// `units` yields the model's unit buffers in order (embeddings, blocks 0..L, final norm;
/// [`zero_gpt::ParamLayout::unit_lens`] long each); each is encoded and dropped before the
/// next is asked for.
///
/// # Errors
/// [`CheckpointError::Format`] for an invalid `config`; [`CheckpointError::ShapeMismatch`] when a unit has the
/// wrong length or there are too few or too many units (the file is then not written);
/// [`CheckpointError::Io`] naming the file.
pub fn export_safetensors<U: AsRef<[f32]>>(
    config: &GptConfig,
    units: impl IntoIterator<Item = U>,
    dtype: SafetensorsDtype,
    path: impl AsRef<Path>,
) -> Result<()> {
    let tensors = checked_tensors(config)?;
    let mut cursor = UnitCursor::new(config, units);
    write_tensors_file(&tensors, dtype, &mut cursor, path.as_ref(), true)
}

/// HF's tensors of `config`, in unit order, after checking the shape.
pub(crate) fn checked_tensors(config: &GptConfig) -> Result<Vec<HfTensor>> {
    ModelShape::from_config(config)
        .validate()
        .map_err(|source| CheckpointError::Format {
            path: "<config>".into(),
            source,
        })?;
    Ok(hf_tensors(config))
}

/// Writes `tensors` (a run of HF's tensors in unit order) as one safetensors file at `path`,
/// atomically, taking their units from `cursor`; when `last`, the file is not written unless
/// the cursor then holds the model's last unit and nothing follows it.
pub(crate) fn write_tensors_file<U: AsRef<[f32]>, I: Iterator<Item = U>>(
    tensors: &[HfTensor],
    dtype: SafetensorsDtype,
    cursor: &mut UnitCursor<U, I>,
    path: &Path,
    last: bool,
) -> Result<()> {
    let header = header_json(tensors, dtype)?;
    let written = crate::fsio::write_atomic(path, |w| {
        w.write_all(&(header.len() as u64).to_le_bytes())?;
        w.write_all(&header)?;
        let mut scratch = Vec::with_capacity(CHUNK_ELEMS * dtype.size());
        for t in tensors {
            let unit = cursor.unit(t.unit)?;
            write_tensor(w, t, unit, dtype, &mut scratch)?;
        }
        if last {
            cursor.expect_end()?;
        }
        Ok(())
    });
    match (written, cursor.refused.take()) {
        (Ok(()), _) => Ok(()),
        (Err(_), Some(e)) => Err(e),
        (Err(e), None) => Err(e.into()),
    }
}

/// The model's units, taken from an iterator one at a time in order and checked against
/// the model's unit sizes; the current one is kept while its tensors are written.
pub(crate) struct UnitCursor<U, I> {
    units: I,
    sizes: Vec<usize>,
    current: Option<(usize, U)>,
    taken: usize,
    /// Why the last [`UnitCursor::unit`] failed (its `io::Error` only stops the writer).
    refused: Option<CheckpointError>,
}

impl<U: AsRef<[f32]>, I: Iterator<Item = U>> UnitCursor<U, I> {
    pub(crate) fn new(
        config: &GptConfig,
        units: impl IntoIterator<Item = U, IntoIter = I>,
    ) -> Self {
        Self {
            units: units.into_iter(),
            sizes: ModelShape::from_config(config).unit_sizes(),
            current: None,
            taken: 0,
            refused: None,
        }
    }

    /// Unit `u` (at or after the current one), checked to have its size.
    fn unit(&mut self, u: usize) -> std::io::Result<&[f32]> {
        while self.current.as_ref().is_none_or(|(at, _)| *at < u) {
            let size = self.sizes.get(self.taken).copied();
            let next = self.units.next();
            let got = next.as_ref().map(|x| x.as_ref().len());
            match (next, size) {
                (Some(unit), Some(size)) if got == Some(size) => {
                    self.current = Some((self.taken, unit));
                    self.taken += 1;
                }
                (_, size) => {
                    self.refused = Some(match (got, size) {
                        (Some(got), Some(size)) => {
                            shape_err(&format!("unit {}", self.taken), size, got)
                        }
                        _ => shape_err("number of units", self.sizes.len(), self.taken),
                    });
                    return Err(std::io::Error::other("unit refused"));
                }
            }
        }
        match &self.current {
            Some((_, unit)) => Ok(unit.as_ref()),
            None => Err(std::io::Error::other("no unit")),
        }
    }

    /// Checks that the iterator had exactly the model's units.
    fn expect_end(&mut self) -> std::io::Result<()> {
        let expected = self.sizes.len();
        let got = if self.taken < expected {
            Some(self.taken)
        } else if self.units.next().is_some() {
            Some(expected + 1)
        } else {
            None
        };
        match got {
            None => Ok(()),
            Some(got) => {
                self.refused = Some(shape_err("number of units", expected, got));
                Err(std::io::Error::other("unit refused"))
            }
        }
    }
}

fn shape_err(what: &str, expected: usize, got: usize) -> CheckpointError {
    CheckpointError::ShapeMismatch {
        what: what.into(),
        expected,
        got,
    }
}

/// Writes `config.json` for HF's `GPT2LMHeadModel` (see [`hf_config_json`]), atomically.
///
/// # Errors
/// [`CheckpointError::Json`] or [`CheckpointError::Io`] naming the file.
pub fn write_hf_config(
    config: &GptConfig,
    dtype: SafetensorsDtype,
    path: impl AsRef<Path>,
) -> Result<()> {
    let path = path.as_ref();
    let json = hf_config_json(config, dtype.torch_name());
    let text = serde_json::to_vec_pretty(&json).map_err(|source| CheckpointError::Json {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(crate::fsio::write_atomic(path, |w| w.write_all(&text))?)
}
