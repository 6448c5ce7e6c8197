//! llm.c's float32 model checkpoint: 256 little-endian int32 (magic 20240326, version 3,
//! maxT, V, L, NH, C, Vp, the rest zero), then every parameter as little-endian f32 in the
//! order of [`super::ModelShape::llmc_tensors`].
//!
//! Sizes from the header are validated, and compared with the bytes actually present,
//! before any parameter memory is allocated, so a corrupt header cannot make the reader
//! allocate terabytes.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use super::error::{CheckpointError, LlmcFormatError, Result};
use super::layout::ModelShape;
use crate::fsio::{failed, read_up_to};

/// Magic number of llm.c float32 model checkpoints.
pub const LLMC_MAGIC: i32 = 20_240_326;
/// The supported version (float32 parameters, padded vocabulary in the header).
pub const LLMC_VERSION: i32 = 3;
/// Header size in bytes.
pub const LLMC_HEADER_BYTES: usize = crate::llmc_header::HEADER_BYTES;

/// Read granularity for streams: memory grows with bytes present, not with the header.
const CHUNK_BYTES: usize = 1 << 20;

/// A GPT-2 model in llm.c's layout: its shape and all parameters, flat, in file order.
#[derive(Debug, Clone, PartialEq)]
pub struct LlmcCheckpoint {
    shape: ModelShape,
    params: Vec<f32>,
}

fn format_err(path: &Path, source: LlmcFormatError) -> CheckpointError {
    CheckpointError::Format {
        path: path.to_path_buf(),
        source,
    }
}

/// Parses and validates the header; returns the shape and the parameter byte count.
fn parse_header(header: &[u8]) -> Result<(ModelShape, u64), LlmcFormatError> {
    if header.len() < LLMC_HEADER_BYTES {
        return Err(LlmcFormatError::TruncatedHeader {
            expected: LLMC_HEADER_BYTES,
            got: header.len(),
        });
    }
    let word = |i: usize| crate::llmc_header::word(header, i);
    if word(0) != LLMC_MAGIC {
        return Err(LlmcFormatError::BadMagic {
            expected: LLMC_MAGIC,
            found: word(0),
        });
    }
    if word(1) != LLMC_VERSION {
        return Err(LlmcFormatError::BadVersion {
            supported: LLMC_VERSION,
            found: word(1),
        });
    }
    let dim = |i: usize, field: &'static str| {
        let v = word(i);
        usize::try_from(v)
            .ok()
            .filter(|&v| v > 0)
            .ok_or(LlmcFormatError::BadDimension {
                field,
                value: i64::from(v),
            })
    };
    let shape = ModelShape {
        max_t: dim(2, "max_t")?,
        vocab: dim(3, "vocab")?,
        layers: dim(4, "layers")?,
        heads: dim(5, "heads")?,
        channels: dim(6, "channels")?,
        padded_vocab: dim(7, "padded_vocab")?,
    };
    shape.validate()?;
    Ok((shape, shape.num_params() as u64 * 4))
}

fn check_len(expected_bytes: u64, got_bytes: u64) -> Result<(), LlmcFormatError> {
    if expected_bytes == got_bytes {
        Ok(())
    } else {
        Err(LlmcFormatError::LengthMismatch {
            expected_bytes,
            got_bytes,
        })
    }
}

fn decode_f32(bytes: &[u8], out: &mut Vec<f32>) {
    out.extend(
        bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
    );
}

/// Opens a checkpoint file and checks its header and length; returns the file positioned
/// after the header, the shape and the parameter byte count.
fn open_checked(path: &Path) -> Result<(File, ModelShape, u64)> {
    let mut file = File::open(path).map_err(failed("open", path))?;
    let mut header = vec![0u8; LLMC_HEADER_BYTES];
    let got = read_up_to(&mut file, &mut header).map_err(failed("read", path))?;
    let (shape, expected) = parse_header(&header[..got]).map_err(|e| format_err(path, e))?;
    let file_len = file.metadata().map_err(failed("stat", path))?.len();
    check_len(expected, file_len.saturating_sub(LLMC_HEADER_BYTES as u64))
        .map_err(|e| format_err(path, e))?;
    Ok((file, shape, expected))
}

impl LlmcCheckpoint {
    /// A model of `shape` with every parameter zero.
    ///
    /// # Errors
    /// [`CheckpointError::Format`] if the shape is invalid.
    pub fn zeros(shape: ModelShape) -> Result<Self> {
        shape
            .validate()
            .map_err(|e| format_err(Path::new("<shape>"), e))?;
        Ok(Self {
            shape,
            params: vec![0.0; shape.num_params()],
        })
    }

    /// Wraps flat parameters in llm.c order.
    ///
    /// # Errors
    /// [`CheckpointError::Format`] for an invalid shape, [`CheckpointError::ShapeMismatch`] for a wrong length.
    pub fn from_flat(shape: ModelShape, params: Vec<f32>) -> Result<Self> {
        shape
            .validate()
            .map_err(|e| format_err(Path::new("<shape>"), e))?;
        if params.len() != shape.num_params() {
            return Err(CheckpointError::ShapeMismatch {
                what: "llm.c parameters".into(),
                expected: shape.num_params(),
                got: params.len(),
            });
        }
        Ok(Self { shape, params })
    }

    /// Builds a checkpoint from per-unit buffers (see [`ModelShape::unit_sizes`]).
    ///
    /// # Errors
    /// As [`ModelShape::units_to_llmc`].
    pub fn from_units<U: AsRef<[f32]>>(shape: ModelShape, units: &[U]) -> Result<Self> {
        let params = shape.units_to_llmc(units)?;
        Ok(Self { shape, params })
    }

    /// The parameters as per-unit buffers.
    ///
    /// # Errors
    /// Cannot fail for a checkpoint built by this module; kept fallible as the layout check.
    pub fn to_units(&self) -> Result<Vec<Vec<f32>>> {
        self.shape.llmc_to_units(&self.params)
    }

    /// The model shape.
    pub fn shape(&self) -> &ModelShape {
        &self.shape
    }

    /// All parameters, flat, in llm.c order.
    pub fn params(&self) -> &[f32] {
        &self.params
    }

    /// One tensor by llm.c name (`"qkvw"` is all layers, (L, 3C, C)).
    pub fn tensor(&self, name: &str) -> Option<&[f32]> {
        let mut offset = 0;
        for t in self.shape.llmc_tensors() {
            let n = t.shape.iter().product::<usize>();
            if t.name == name {
                return Some(&self.params[offset..offset + n]);
            }
            offset += n;
        }
        None
    }

    /// Loads a checkpoint file, checking its length against the header before allocating.
    ///
    /// # Errors
    /// [`CheckpointError::Io`] if the file cannot be opened or read; [`CheckpointError::Format`] naming the file
    /// for a truncated, foreign, wrong-version, absurd or length-mismatched file.
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let (mut file, shape, expected) = open_checked(path)?;
        // The length was checked against the file, so reserving it all is safe here.
        let params = read_params(&mut file, expected, shape.num_params()).map_err(|e| match e {
            ReadError::Io(source) => failed("read", path)(source).into(),
            ReadError::Format(source) => format_err(path, source),
        })?;
        Ok(Self { shape, params })
    }

    /// The shape in a checkpoint file's header, checked against the file's length; the
    /// parameters are not read.
    ///
    /// # Errors
    /// As [`LlmcCheckpoint::load`].
    pub fn read_shape(path: impl AsRef<Path>) -> Result<ModelShape> {
        Ok(open_checked(path.as_ref())?.1)
    }

    /// Parses a checkpoint held in memory (the entry point of the fuzz target).
    ///
    /// # Errors
    /// [`CheckpointError::Format`] (path `<memory>`) as for [`LlmcCheckpoint::load`].
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let path = Path::new("<memory>");
        let (shape, expected) = parse_header(bytes).map_err(|e| format_err(path, e))?;
        let payload = &bytes[LLMC_HEADER_BYTES..];
        check_len(expected, payload.len() as u64).map_err(|e| format_err(path, e))?;
        let mut params = Vec::with_capacity(shape.num_params());
        decode_f32(payload, &mut params);
        Ok(Self { shape, params })
    }

    /// Parses a checkpoint from a stream, reading at most one byte past what the header
    /// announces; memory grows with the bytes present, not with the header's claim.
    ///
    /// # Errors
    /// [`CheckpointError::Io`] on read failure, [`CheckpointError::Format`] (path `<stream>`) on malformed data.
    pub fn read_from(mut reader: impl Read) -> Result<Self> {
        let path = PathBuf::from("<stream>");
        let mut header = vec![0u8; LLMC_HEADER_BYTES];
        let got = read_up_to(&mut reader, &mut header).map_err(failed("read", &path))?;
        let (shape, expected) = parse_header(&header[..got]).map_err(|e| format_err(&path, e))?;
        let reserve = shape.num_params().min(CHUNK_BYTES / 4);
        let params = read_params(&mut reader, expected, reserve).map_err(|e| match e {
            ReadError::Io(source) => failed("read", &path)(source).into(),
            ReadError::Format(source) => format_err(&path, source),
        })?;
        Ok(Self { shape, params })
    }

    fn header_bytes(&self) -> [u8; LLMC_HEADER_BYTES] {
        header_bytes(&self.shape)
    }

    /// The file's bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(LLMC_HEADER_BYTES + 4 * self.params.len());
        out.extend_from_slice(&self.header_bytes());
        for p in &self.params {
            out.extend_from_slice(&p.to_le_bytes());
        }
        out
    }

    /// Writes the checkpoint to a stream.
    ///
    /// # Errors
    /// The writer's I/O error.
    pub fn write_to(&self, mut writer: impl Write) -> std::io::Result<()> {
        writer.write_all(&self.header_bytes())?;
        let mut buf = Vec::with_capacity(CHUNK_BYTES);
        for chunk in self.params.chunks(CHUNK_BYTES / 4) {
            buf.clear();
            for p in chunk {
                buf.extend_from_slice(&p.to_le_bytes());
            }
            writer.write_all(&buf)?;
        }
        writer.flush()
    }

    /// Saves atomically and durably: to `<path>.tmp`, fsynced, renamed over `path`, then
    /// the directory fsynced.
    ///
    /// # Errors
    /// [`CheckpointError::Io`] naming the file.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        Ok(crate::fsio::write_atomic(path.as_ref(), |w| {
            self.write_to(w)
        })?)
    }
}

enum ReadError {
    Io(std::io::Error),
    Format(LlmcFormatError),
}

/// Reads exactly `expected` parameter bytes in chunks, then checks nothing follows.
/// `reserve` is the capacity to allocate up front: the full count only where the caller has
/// already checked that the bytes exist; otherwise the vector grows with the bytes read.
fn read_params(
    reader: &mut impl Read,
    expected: u64,
    reserve: usize,
) -> Result<Vec<f32>, ReadError> {
    let mut params = Vec::with_capacity(reserve);
    let mut buf = vec![0u8; CHUNK_BYTES];
    let mut remaining = expected;
    while remaining > 0 {
        let want = remaining.min(CHUNK_BYTES as u64) as usize;
        let got = read_up_to(reader, &mut buf[..want]).map_err(ReadError::Io)?;
        if got < want {
            return Err(ReadError::Format(LlmcFormatError::LengthMismatch {
                expected_bytes: expected,
                got_bytes: expected - remaining + got as u64,
            }));
        }
        decode_f32(&buf[..got], &mut params);
        remaining -= got as u64;
    }
    let extra = read_up_to(reader, &mut buf[..1]).map_err(ReadError::Io)?;
    if extra > 0 {
        return Err(ReadError::Format(LlmcFormatError::LengthMismatch {
            expected_bytes: expected,
            got_bytes: expected + 1,
        }));
    }
    Ok(params)
}

/// The 256-word llm.c header of a model of `shape`.
pub(crate) fn header_bytes(s: &ModelShape) -> [u8; LLMC_HEADER_BYTES] {
    // Validated shapes fit i32 only if the writer produced them; clamp rather than wrap
    // so a huge shape fails on reading instead of aliasing to a small one.
    let w = |v: usize| i32::try_from(v).unwrap_or(i32::MAX);
    let words = [
        LLMC_MAGIC,
        LLMC_VERSION,
        w(s.max_t),
        w(s.vocab),
        w(s.layers),
        w(s.heads),
        w(s.channels),
        w(s.padded_vocab),
    ];
    crate::llmc_header::encode(&words)
}
