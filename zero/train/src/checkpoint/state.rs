//! The trainer's resumable state: a directory holding `manifest.json` and `tensors.bin`.
//!
//! `tensors.bin` is every tensor's raw little-endian bytes, back to back, in the order
//! written. `manifest.json` records the format name and version, the step, a free-form JSON
//! `meta` object (configuration, data-loader position, RNG state, loss scale...), and per
//! tensor its name, dtype, element count, byte offset and a 64-bit checksum of its bytes
//! (word-wise FNV-1a, see `checksum.rs`). Values are stored bit-exactly, so resuming from step k can reproduce a run that
//! never stopped, to the bit.
//!
//! Names are the caller's; the trainer uses paths such as `model/unit3`,
//! `rank1/master/unit3`, `rank1/adam_m/unit3` so that each rank's optimizer shards stay
//! separate and a restore with the same rank count reads back exactly its own.
//!
//! Writing goes to `<dir>.partial` (files and directory fsynced) and is renamed into place
//! at the end, then the parent directory is fsynced, so a crash while saving leaves the
//! previous state intact and a finished save survives a power cut. JSON plus one raw blob was chosen over
//! safetensors to keep zero dependencies and to allow a per-tensor checksum; the raw blob
//! keeps bulk data out of the JSON parser.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::checksum::Checksum;
use super::error::{Error, Result};
use crate::fsio::{create_synced, failed, sync_dir, sync_parent, with_suffix};

/// Format name in the manifest.
pub const STATE_FORMAT: &str = "zero-train-state";
/// Format version written by this code; readers refuse other versions.
pub const STATE_VERSION: u32 = 1;

const MANIFEST: &str = "manifest.json";
const DATA: &str = "tensors.bin";
const CHUNK_ELEMS: usize = 1 << 16;

/// An element type that can be stored: its manifest name and little-endian encoding.
pub trait Element: Copy + Default {
    /// The dtype string in the manifest.
    const DTYPE: &'static str;
    /// Bytes per element.
    const SIZE: usize;
    /// Appends the little-endian bytes.
    fn put(self, out: &mut Vec<u8>);
    /// Decodes from exactly `SIZE` little-endian bytes.
    fn get(bytes: &[u8]) -> Self;
}

macro_rules! element {
    ($t:ty, $name:literal, $size:literal, $bits:ty) => {
        impl Element for $t {
            const DTYPE: &'static str = $name;
            const SIZE: usize = $size;
            fn put(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_bits().to_le_bytes());
            }
            fn get(bytes: &[u8]) -> Self {
                let mut raw = [0u8; $size];
                raw.copy_from_slice(bytes);
                <$t>::from_bits(<$bits>::from_le_bytes(raw))
            }
        }
    };
}

element!(f32, "f32", 4, u32);
element!(half::bf16, "bf16", 2, u16);
element!(half::f16, "f16", 2, u16);

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
struct TensorEntry {
    name: String,
    dtype: String,
    len: u64,
    offset: u64,
    checksum: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
struct Manifest {
    format: String,
    version: u32,
    step: u64,
    meta: serde_json::Value,
    data_bytes: u64,
    tensors: Vec<TensorEntry>,
}

/// Writes a training-state directory tensor by tensor, without holding copies.
#[derive(Debug)]
pub struct StateWriter {
    dir: PathBuf,
    partial: PathBuf,
    data: BufWriter<File>,
    entries: Vec<TensorEntry>,
    offset: u64,
    scratch: Vec<u8>,
}

impl StateWriter {
    /// Starts writing the state that will live at `dir` (replacing any state there once
    /// [`StateWriter::finish`] succeeds).
    ///
    /// # Errors
    /// [`Error::Io`] if the staging directory cannot be created.
    pub fn create(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref().to_path_buf();
        let partial = with_suffix(&dir, ".partial");
        if partial.exists() {
            std::fs::remove_dir_all(&partial).map_err(failed("remove stale", &partial))?;
        }
        std::fs::create_dir_all(&partial).map_err(failed("create directory", &partial))?;
        let data_path = partial.join(DATA);
        let file = File::create(&data_path).map_err(failed("create", &data_path))?;
        Ok(Self {
            dir,
            partial,
            data: BufWriter::new(file),
            entries: Vec::new(),
            offset: 0,
            scratch: Vec::new(),
        })
    }

    /// Appends one tensor.
    ///
    /// # Errors
    /// [`Error::Tensor`] for a duplicate name, [`Error::Io`] if writing fails.
    pub fn write<E: Element>(&mut self, name: &str, data: &[E]) -> Result<()> {
        if self.entries.iter().any(|e| e.name == name) {
            return Err(Error::Tensor {
                path: self.dir.clone(),
                name: name.into(),
                reason: "written twice".into(),
            });
        }
        let mut hash = Checksum::new();
        let data_path = self.partial.join(DATA);
        for chunk in data.chunks(CHUNK_ELEMS) {
            self.scratch.clear();
            for &x in chunk {
                x.put(&mut self.scratch);
            }
            hash.update(&self.scratch);
            self.data
                .write_all(&self.scratch)
                .map_err(failed("write", &data_path))?;
        }
        let bytes = (data.len() * E::SIZE) as u64;
        self.entries.push(TensorEntry {
            name: name.into(),
            dtype: E::DTYPE.into(),
            len: data.len() as u64,
            offset: self.offset,
            checksum: hash.finish(),
        });
        self.offset += bytes;
        Ok(())
    }

    /// Writes the manifest, syncs, and moves the state into place.
    ///
    /// # Errors
    /// [`Error::Io`] if a write, sync or rename fails.
    pub fn finish(self, step: u64, meta: serde_json::Value) -> Result<()> {
        let data_path = self.partial.join(DATA);
        let file = self.data.into_inner().map_err(|e| Error::Io {
            op: "write",
            path: data_path.clone(),
            source: e.into_error(),
        })?;
        file.sync_all().map_err(failed("sync", &data_path))?;
        let manifest = Manifest {
            format: STATE_FORMAT.into(),
            version: STATE_VERSION,
            step,
            meta,
            data_bytes: self.offset,
            tensors: self.entries,
        };
        let manifest_path = self.partial.join(MANIFEST);
        let json = serde_json::to_vec_pretty(&manifest).map_err(|source| Error::Json {
            path: manifest_path.clone(),
            source,
        })?;
        create_synced(&manifest_path, |w| w.write_all(&json))?;
        // The staged entries must be durable before the rename publishes them.
        sync_dir(&self.partial)?;
        // Replace an older state only once the new one is complete.
        let old = with_suffix(&self.dir, ".old");
        if self.dir.exists() {
            if old.exists() {
                std::fs::remove_dir_all(&old).map_err(failed("remove stale", &old))?;
            }
            std::fs::rename(&self.dir, &old).map_err(failed("rename aside", &self.dir))?;
        }
        std::fs::rename(&self.partial, &self.dir).map_err(failed("rename into", &self.dir))?;
        sync_parent(&self.dir)?;
        if old.exists() {
            std::fs::remove_dir_all(&old).map_err(failed("remove", &old))?;
        }
        Ok(())
    }
}

/// Reads a training-state directory; tensors are read on demand and checksum-verified.
#[derive(Debug)]
pub struct StateReader {
    dir: PathBuf,
    manifest: Manifest,
    index: HashMap<String, usize>,
    data: BufReader<File>,
}

impl StateReader {
    /// Opens a state directory and checks its manifest against the data file: format,
    /// version, tensor extents inside the file, no overlaps, and the data file's length.
    ///
    /// # Errors
    /// [`Error::Io`], [`Error::Json`] or [`Error::BadState`] saying what is inconsistent.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref().to_path_buf();
        let manifest_path = dir.join(MANIFEST);
        let bytes = std::fs::read(&manifest_path).map_err(failed("read", &manifest_path))?;
        let manifest: Manifest = serde_json::from_slice(&bytes).map_err(|source| Error::Json {
            path: manifest_path.clone(),
            source,
        })?;
        let bad = |reason: String| Error::BadState {
            path: dir.clone(),
            reason,
        };
        if manifest.format != STATE_FORMAT {
            return Err(bad(format!(
                "format is {:?}, expected {STATE_FORMAT:?}",
                manifest.format
            )));
        }
        if manifest.version != STATE_VERSION {
            return Err(bad(format!(
                "version {} is not supported (this build reads {STATE_VERSION})",
                manifest.version
            )));
        }
        let data_path = dir.join(DATA);
        let file = File::open(&data_path).map_err(failed("open", &data_path))?;
        let file_len = file.metadata().map_err(failed("stat", &data_path))?.len();
        if file_len != manifest.data_bytes {
            return Err(bad(format!(
                "{DATA} has {file_len} bytes, the manifest says {}",
                manifest.data_bytes
            )));
        }
        let mut index = HashMap::new();
        let mut end = 0u64;
        for (i, t) in manifest.tensors.iter().enumerate() {
            let size = dtype_size(&t.dtype)
                .ok_or_else(|| bad(format!("tensor {}: unknown dtype {:?}", t.name, t.dtype)))?;
            let bytes = t.len.checked_mul(size as u64);
            let stop = bytes.and_then(|b| t.offset.checked_add(b));
            match stop {
                Some(stop) if t.offset == end && stop <= file_len => end = stop,
                _ => {
                    return Err(bad(format!(
                        "tensor {} has an extent outside or out of order in {DATA}",
                        t.name
                    )))
                }
            }
            if index.insert(t.name.clone(), i).is_some() {
                return Err(bad(format!("tensor {} appears twice", t.name)));
            }
        }
        if end != file_len {
            return Err(bad(format!(
                "{DATA} has {} bytes that no tensor claims",
                file_len - end
            )));
        }
        Ok(Self {
            dir,
            manifest,
            index,
            data: BufReader::new(file),
        })
    }

    /// The training step the state was saved at.
    pub fn step(&self) -> u64 {
        self.manifest.step
    }

    /// The caller's free-form metadata (configuration, loader state, RNG state...).
    pub fn meta(&self) -> &serde_json::Value {
        &self.manifest.meta
    }

    /// Tensor names in the order they were written.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.manifest.tensors.iter().map(|t| t.name.as_str())
    }

    /// Element count and dtype of a tensor, if present.
    pub fn describe(&self, name: &str) -> Option<(usize, &str)> {
        self.index.get(name).map(|&i| {
            let t = &self.manifest.tensors[i];
            (t.len as usize, t.dtype.as_str())
        })
    }

    /// Reads a tensor into `out`, verifying dtype, length and checksum.
    ///
    /// # Errors
    /// [`Error::Tensor`] if missing or of another dtype or length; [`Error::Io`];
    /// [`Error::ChecksumMismatch`] if the bytes are corrupt (`out` then holds garbage).
    pub fn read_into<E: Element>(&mut self, name: &str, out: &mut [E]) -> Result<()> {
        let tensor_err = |reason: String| Error::Tensor {
            path: self.dir.clone(),
            name: name.into(),
            reason,
        };
        let &i = self
            .index
            .get(name)
            .ok_or_else(|| tensor_err("not in the state".into()))?;
        let t = self.manifest.tensors[i].clone();
        if t.dtype != E::DTYPE {
            return Err(tensor_err(format!(
                "stored as {}, requested as {}",
                t.dtype,
                E::DTYPE
            )));
        }
        if t.len != out.len() as u64 {
            return Err(tensor_err(format!(
                "has {} elements, the buffer {}",
                t.len,
                out.len()
            )));
        }
        let data_path = self.dir.join(DATA);
        self.data
            .seek(SeekFrom::Start(t.offset))
            .map_err(failed("seek", &data_path))?;
        let mut hash = Checksum::new();
        let mut buf = vec![0u8; CHUNK_ELEMS * E::SIZE];
        for chunk in out.chunks_mut(CHUNK_ELEMS) {
            let bytes = &mut buf[..chunk.len() * E::SIZE];
            self.data
                .read_exact(bytes)
                .map_err(failed("read", &data_path))?;
            hash.update(bytes);
            for (x, b) in chunk.iter_mut().zip(bytes.chunks_exact(E::SIZE)) {
                *x = E::get(b);
            }
        }
        let found = hash.finish();
        if found != t.checksum {
            return Err(Error::ChecksumMismatch {
                path: self.dir.clone(),
                name: name.into(),
                expected: t.checksum,
                found,
            });
        }
        Ok(())
    }

    /// Reads a whole tensor into a new vector.
    ///
    /// # Errors
    /// As [`StateReader::read_into`].
    pub fn read<E: Element>(&mut self, name: &str) -> Result<Vec<E>> {
        let (len, _) = self.describe(name).ok_or_else(|| Error::Tensor {
            path: self.dir.clone(),
            name: name.into(),
            reason: "not in the state".into(),
        })?;
        // The manifest's length was checked against the file size in `open`.
        let mut out = vec![E::default(); len];
        self.read_into(name, &mut out)?;
        Ok(out)
    }
}

fn dtype_size(dtype: &str) -> Option<usize> {
    match dtype {
        "f32" => Some(4),
        "bf16" | "f16" => Some(2),
        _ => None,
    }
}
