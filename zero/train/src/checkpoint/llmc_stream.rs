//! An llm.c checkpoint written one unit at a time, so a rank exporting a model never holds
//! more than one unit's parameters beyond its own states.
//!
//! llm.c stores each tensor for all layers together (`ln1w` of every layer, then `ln1b`, ...),
//! so one unit's tensors land at scattered offsets: the writer sizes the file up front and
//! writes each piece at its offset ([`ModelShape::unit_pieces`]). The file is `<path>.tmp`
//! until every unit is written; [`LlmcStreamWriter::finish`] fsyncs it, renames it over
//! `path` and fsyncs the directory, like every other save. Dropped unfinished, it removes the
//! temporary file and leaves `path` untouched.

use std::fs::File;
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use super::error::{CheckpointError, Result};
use super::layout::{check_len, ModelShape};
use super::llmc::{header_bytes, LLMC_HEADER_BYTES};
use crate::fsio::{failed, sync_parent, with_suffix};

/// Bytes converted per write.
const CHUNK_FLOATS: usize = 1 << 16;

/// A checkpoint being written unit by unit.
#[derive(Debug)]
pub struct LlmcStreamWriter {
    path: PathBuf,
    tmp: PathBuf,
    file: Option<File>,
    shape: ModelShape,
    written: Vec<bool>,
}

impl LlmcStreamWriter {
    /// Starts `path` for a model of `shape` (creating its folder): the header, and room for
    /// every parameter.
    ///
    /// # Errors
    /// [`CheckpointError::Format`] for an invalid shape, [`CheckpointError::Io`] naming the file.
    pub fn create(path: &Path, shape: ModelShape) -> Result<Self> {
        shape.validate().map_err(|source| CheckpointError::Format {
            path: path.to_path_buf(),
            source,
        })?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(failed("create directory", dir))?;
        }
        let tmp = with_suffix(path, ".tmp");
        let mut file = File::create(&tmp).map_err(failed("create", &tmp))?;
        let bytes = 4 * shape.num_params() as u64 + LLMC_HEADER_BYTES as u64;
        file.write_all(&header_bytes(&shape))
            .and_then(|()| file.set_len(bytes))
            .map_err(failed("write", &tmp))?;
        Ok(Self {
            path: path.to_path_buf(),
            tmp,
            file: Some(file),
            written: vec![false; shape.unit_sizes().len()],
            shape,
        })
    }

    /// Checks, before a run that ends by exporting to `path`, that the file can be written
    /// there: creates its folder and creates and removes `<path>.tmp`. So a bad destination
    /// fails at start-up, not after the training it was meant to keep.
    ///
    /// # Errors
    /// [`CheckpointError::Io`] naming the folder or file.
    pub fn check_destination(path: &Path) -> Result<()> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(failed("create directory", dir))?;
        }
        let tmp = with_suffix(path, ".tmp");
        File::create(&tmp).map_err(failed("create", &tmp))?;
        std::fs::remove_file(&tmp).map_err(failed("remove", &tmp))?;
        Ok(())
    }

    /// Writes unit `unit`'s parameters (its whole, unpadded elements) where llm.c keeps them.
    ///
    /// # Errors
    /// [`CheckpointError::ShapeMismatch`] for a unit that does not exist or a wrong length,
    /// [`CheckpointError::Io`] naming the file.
    pub fn write_unit(&mut self, unit: usize, values: &[f32]) -> Result<()> {
        let sizes = self.shape.unit_sizes();
        let Some(&size) = sizes.get(unit) else {
            return Err(CheckpointError::ShapeMismatch {
                what: format!("units of the model (unit {unit} was written)"),
                expected: sizes.len(),
                got: unit + 1,
            });
        };
        check_len(&format!("unit {unit}"), size, values.len())?;
        let tmp = self.tmp.clone();
        let file = self
            .file
            .as_mut()
            .ok_or_else(|| failed("write", &tmp)(std::io::ErrorKind::BrokenPipe.into()))?;
        let mut buf = Vec::with_capacity(4 * CHUNK_FLOATS);
        for (flat, range) in self.shape.unit_pieces(unit) {
            let at = LLMC_HEADER_BYTES as u64 + 4 * flat as u64;
            file.seek(SeekFrom::Start(at))
                .map_err(failed("seek", &tmp))?;
            for chunk in values[range].chunks(CHUNK_FLOATS) {
                buf.clear();
                buf.extend(chunk.iter().flat_map(|v| v.to_le_bytes()));
                file.write_all(&buf).map_err(failed("write", &tmp))?;
            }
        }
        self.written[unit] = true;
        Ok(())
    }

    /// Publishes the file once every unit is written.
    ///
    /// # Errors
    /// [`CheckpointError::ShapeMismatch`] naming a unit never written, [`CheckpointError::Io`] naming the file.
    pub fn finish(mut self) -> Result<()> {
        if let Some(missing) = self.written.iter().position(|w| !w) {
            return Err(CheckpointError::ShapeMismatch {
                what: format!("units written before unit {missing} is"),
                expected: self.written.len(),
                got: self.written.iter().filter(|w| **w).count(),
            });
        }
        if let Some(file) = self.file.take() {
            file.sync_all().map_err(failed("sync", &self.tmp))?;
        }
        std::fs::rename(&self.tmp, &self.path).map_err(failed("rename into", &self.path))?;
        Ok(sync_parent(&self.path)?)
    }
}

impl Drop for LlmcStreamWriter {
    fn drop(&mut self) {
        if self.file.take().is_some() {
            // Best effort: an unfinished export leaves no partial file behind.
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}
