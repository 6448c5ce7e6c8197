//! The safetensors container, read side: the header parsed and every extent checked
//! before a byte of tensor data is touched.
//!
//! Rules (those of the reference `safetensors` reader): an 8-byte little-endian header
//! length N (at most 100 MB), N bytes of a JSON object mapping names to `{dtype, shape,
//! data_offsets: [begin, end)}` plus an optional `__metadata__`, then the data; every
//! tensor's byte count is its element count times its dtype's size, and the extents,
//! sorted, tile the data exactly (no gap, no overlap, nothing after). Tiling is what bounds
//! the memory a reader allocates by the size of the file.

use std::collections::HashMap;
use std::io::Read;

use super::error::SafetensorsError;
use crate::fsio::read_up_to;

/// The reference reader's header limit.
pub(crate) const MAX_HEADER_BYTES: u64 = 100_000_000;

/// Element types a GPT-2 file can hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dtype {
    F32,
    Bf16,
    F16,
}

impl Dtype {
    fn parse(name: &str) -> Option<Self> {
        match name {
            "F32" => Some(Self::F32),
            "BF16" => Some(Self::Bf16),
            "F16" => Some(Self::F16),
            _ => None,
        }
    }

    pub(crate) fn size(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::Bf16 | Self::F16 => 2,
        }
    }

    /// Decodes one element from exactly `size()` little-endian bytes.
    pub(crate) fn decode(self, b: &[u8]) -> f32 {
        match (self, b) {
            (Self::F32, &[a, b, c, d]) => f32::from_le_bytes([a, b, c, d]),
            (Self::Bf16, &[a, b]) => half::bf16::from_le_bytes([a, b]).to_f32(),
            (Self::F16, &[a, b]) => half::f16::from_le_bytes([a, b]).to_f32(),
            _ => f32::NAN,
        }
    }
}

/// One tensor's entry, checked against the data's length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) dtype: Dtype,
    pub(crate) shape: Vec<usize>,
    /// Byte range inside the data (after the header).
    pub(crate) begin: u64,
    pub(crate) end: u64,
}

/// A parsed header: the entries by name and where the data starts in the file.
#[derive(Debug)]
pub(crate) struct Header {
    pub(crate) entries: HashMap<String, Entry>,
    pub(crate) data_start: u64,
}

/// Why reading failed: the bytes are wrong, or the reader itself failed.
#[derive(Debug)]
pub(crate) enum ReadFail {
    Io(std::io::Error),
    Format(SafetensorsError),
}

impl From<SafetensorsError> for ReadFail {
    fn from(e: SafetensorsError) -> Self {
        Self::Format(e)
    }
}

fn bad_entry(tensor: &str, reason: impl Into<String>) -> SafetensorsError {
    SafetensorsError::BadEntry {
        tensor: tensor.into(),
        reason: reason.into(),
    }
}

fn bad_extent(tensor: &str, reason: String) -> SafetensorsError {
    SafetensorsError::BadExtent {
        tensor: tensor.into(),
        reason,
    }
}

/// Reads and checks the header of a file of `file_len` bytes from its start.
pub(crate) fn read_header(r: &mut impl Read, file_len: u64) -> Result<Header, ReadFail> {
    let mut len_bytes = [0u8; 8];
    let got = read_up_to(r, &mut len_bytes).map_err(ReadFail::Io)?;
    if got < 8 {
        return Err(truncated("the header length", 8, got as u64));
    }
    let n = u64::from_le_bytes(len_bytes);
    if n > MAX_HEADER_BYTES {
        return Err(SafetensorsError::HeaderTooLarge {
            declared: n,
            limit: MAX_HEADER_BYTES,
        }
        .into());
    }
    let available = file_len.saturating_sub(8);
    if n > available {
        return Err(truncated("the header", n, available));
    }
    // n <= 100 MB, so it fits usize and is checked against the file before allocating.
    let mut text = vec![0u8; n as usize];
    let got = read_up_to(r, &mut text).map_err(ReadFail::Io)?;
    if (got as u64) < n {
        return Err(truncated("the header", n, got as u64));
    }
    let data_len = available - n;
    let entries = parse_entries(&text, data_len)?;
    Ok(Header {
        entries,
        data_start: 8 + n,
    })
}

fn truncated(what: &'static str, expected: u64, got: u64) -> ReadFail {
    SafetensorsError::Truncated {
        what,
        expected,
        got,
    }
    .into()
}

/// Parses the JSON and checks each entry, then that the extents tile `data_len` bytes.
fn parse_entries(text: &[u8], data_len: u64) -> Result<HashMap<String, Entry>, SafetensorsError> {
    let map: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(text).map_err(|e| SafetensorsError::CorruptHeader {
            reason: e.to_string(),
        })?;
    let mut entries = HashMap::with_capacity(map.len());
    for (name, value) in map {
        if name == "__metadata__" {
            continue;
        }
        let entry = parse_entry(&name, &value)?;
        if entry.end > data_len {
            return Err(bad_extent(
                &name,
                format!(
                    "its data ends at byte {} but the file holds {data_len} bytes of data (truncated?)",
                    entry.end
                ),
            ));
        }
        entries.insert(name, entry);
    }
    let mut extents: Vec<(&String, &Entry)> = entries.iter().collect();
    extents.sort_by_key(|(name, e)| (e.begin, e.end, *name));
    let mut at = 0u64;
    for (name, e) in extents {
        if e.begin != at {
            let how = if e.begin < at {
                "overlaps"
            } else {
                "leaves a gap after"
            };
            return Err(bad_extent(
                name,
                format!(
                    "starts at byte {} and {how} the data ending at {at}",
                    e.begin
                ),
            ));
        }
        at = e.end;
    }
    if at != data_len {
        return Err(SafetensorsError::CorruptHeader {
            reason: format!(
                "the tensors hold {at} bytes but the file has {data_len} bytes of data"
            ),
        });
    }
    Ok(entries)
}

fn parse_entry(name: &str, value: &serde_json::Value) -> Result<Entry, SafetensorsError> {
    let dtype_name = value
        .get("dtype")
        .and_then(|d| d.as_str())
        .ok_or_else(|| bad_entry(name, "no dtype string"))?;
    let dtype = Dtype::parse(dtype_name).ok_or_else(|| SafetensorsError::UnsupportedDtype {
        tensor: name.into(),
        dtype: dtype_name.into(),
    })?;
    let ints = |key: &str| -> Result<Vec<u64>, SafetensorsError> {
        let arr = value
            .get(key)
            .and_then(|v| v.as_array())
            .ok_or_else(|| bad_entry(name, format!("no {key} array")))?;
        arr.iter()
            .map(|x| {
                x.as_u64()
                    .ok_or_else(|| bad_entry(name, format!("{key} holds {x}")))
            })
            .collect()
    };
    let shape = ints("shape")?
        .into_iter()
        .map(|d| {
            usize::try_from(d).map_err(|_| bad_entry(name, format!("dimension {d} is too large")))
        })
        .collect::<Result<Vec<usize>, _>>()?;
    let (begin, end) = match ints("data_offsets")?[..] {
        [b, e] if b <= e => (b, e),
        ref other => {
            return Err(bad_entry(
                name,
                format!("data_offsets {other:?} is not [begin, end]"),
            ))
        }
    };
    let bytes = shape
        .iter()
        .try_fold(dtype.size() as u64, |acc, &d| acc.checked_mul(d as u64));
    if bytes != Some(end - begin) {
        return Err(bad_extent(
            name,
            format!(
                "shape {shape:?} of {dtype_name} needs {} bytes, data_offsets give {}",
                bytes.map_or("more than 2^64".to_string(), |b| b.to_string()),
                end - begin
            ),
        ));
    }
    Ok(Entry {
        dtype,
        shape,
        begin,
        end,
    })
}
