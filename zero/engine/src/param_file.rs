//! The parameters' file tier (`--offload-params nvme`): a rank's stored parameter shards of
//! the units stage 3 gathers, in one zero-alloc [`TierFile`] (tier `params`) laid out as
//! [`ParamFileLayout`] says, moved through one fixed [`ChunkPool`] buffer on the engine's
//! thread; the read-ahead's I/O thread (`param_read_ahead`) reads the same file through a
//! pool of its own.
//!
//! Reads and writes are of byte ranges of a unit's shard: a range that covers a piece
//! whole moves it straight between the file and the caller's bytes; a partial piece is read
//! whole, patched and written back (the last piece of a shard whose padding the update does
//! not write).

use super::error::{Error, Result};
use super::optimizer_file::create_tier;
use super::planning::offload_plan::ParamFileLayout;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;
use zero_alloc::tier::{ChunkPool, TierFile};

/// The tier name of the parameters' files.
pub const PARAMS_TIER: &str = "params";

/// A rank's parameter file, its pool buffer, and what has moved.
#[derive(Debug)]
pub(crate) struct ParamFile {
    tier: Arc<TierFile>,
    pool: ChunkPool,
    layout: ParamFileLayout,
    /// Bytes read from and written to the file since start-up, and the seconds spent in
    /// those reads and writes.
    pub read_bytes: u64,
    pub written_bytes: u64,
    pub io_seconds: (f64, f64),
}

/// The file is the run's scratch (the parameters outlive it in checkpoints), so it goes with
/// the engine.
impl Drop for ParamFile {
    fn drop(&mut self) {
        // A file already gone, or a folder made read-only since, leaves nothing to do.
        let _ = std::fs::remove_file(self.tier.path());
    }
}

impl ParamFile {
    /// Creates `dir`'s parameter file for `rank` of `world`, zeroed, laid out as `layout`
    /// says, with a pool buffer of `chunk` bytes.
    pub fn create(
        dir: &Path,
        ranks: (usize, usize),
        layout: ParamFileLayout,
        chunk: usize,
    ) -> Result<Self> {
        let tier = Arc::new(create_tier(dir, ranks, PARAMS_TIER, &layout.lens)?);
        Ok(Self {
            tier,
            pool: ChunkPool::new(1, chunk)?,
            layout,
            read_bytes: 0,
            written_bytes: 0,
            io_seconds: (0.0, 0.0),
        })
    }

    /// The file, shared with the read-ahead's I/O thread, and its layout.
    pub fn shared(&self) -> (Arc<TierFile>, ParamFileLayout) {
        (Arc::clone(&self.tier), self.layout.clone())
    }

    /// The file.
    pub fn path(&self) -> &Path {
        self.tier.path()
    }

    /// The file's bytes, header included.
    pub fn file_bytes(&self) -> u64 {
        self.tier.file_bytes()
    }

    /// The pool buffer's bytes.
    pub fn pool_bytes(&self) -> u64 {
        self.pool.bytes() as u64
    }

    /// The file bypasses the page cache (`O_DIRECT`).
    pub fn is_direct(&self) -> bool {
        self.tier.is_direct()
    }

    /// Bytes moved through a pool buffer on either thread ([`TierFile::pooled_bytes`]).
    pub fn pooled_bytes(&self) -> u64 {
        self.tier.pooled_bytes()
    }

    /// Fills `out` from byte `at` of `unit`'s shard on.
    pub fn read(&mut self, unit: usize, at: usize, out: &mut [u8]) -> Result<()> {
        let start = Instant::now();
        let read = self.read_pieces(unit, at, out);
        self.io_seconds.0 += start.elapsed().as_secs_f64();
        read
    }

    /// Writes `data` into `unit`'s shard from byte `at` on.
    pub fn write(&mut self, unit: usize, at: usize, data: &[u8]) -> Result<()> {
        let start = Instant::now();
        let written = self.write_pieces(unit, at, data);
        self.io_seconds.1 += start.elapsed().as_secs_f64();
        written
    }

    /// [`ParamFile::read`], piece by piece.
    fn read_pieces(&mut self, unit: usize, at: usize, out: &mut [u8]) -> Result<()> {
        let mut done = 0;
        while done < out.len() {
            let (index, from, len) = self.piece_at(unit, at + done)?;
            let n = (len - from).min(out.len() - done);
            let dst = &mut out[done..done + n];
            if n == len {
                self.tier.read_piece(index, dst, &mut self.pool)?;
            } else {
                let whole = self.read_whole(index, len)?;
                dst.copy_from_slice(&whole[from..from + n]);
            }
            self.read_bytes += len as u64;
            done += n;
        }
        Ok(())
    }

    /// [`ParamFile::write`], piece by piece (a partial piece read, patched and written).
    fn write_pieces(&mut self, unit: usize, at: usize, data: &[u8]) -> Result<()> {
        let mut done = 0;
        while done < data.len() {
            let (index, from, len) = self.piece_at(unit, at + done)?;
            let n = (len - from).min(data.len() - done);
            let src = &data[done..done + n];
            if n == len {
                self.tier.write_piece(index, src, &mut self.pool)?;
            } else {
                let mut whole = self.read_whole(index, len)?;
                self.read_bytes += len as u64;
                whole[from..from + n].copy_from_slice(src);
                self.tier.write_piece(index, &whole, &mut self.pool)?;
            }
            self.written_bytes += len as u64;
            done += n;
        }
        Ok(())
    }

    /// Piece `index`, all `len` bytes of it.
    fn read_whole(&mut self, index: usize, len: usize) -> Result<Vec<u8>> {
        let mut whole = vec![0u8; len];
        self.tier.read_piece(index, &mut whole, &mut self.pool)?;
        Ok(whole)
    }

    /// The piece holding byte `at` of `unit`'s shard: its index in the file, the byte of it
    /// `at` is, and its length.
    fn piece_at(&self, unit: usize, at: usize) -> Result<(usize, usize, usize)> {
        let pieces = self.layout.pieces(unit);
        let k = at / self.layout.piece_bytes.max(1);
        let index = pieces.start + k;
        let from = at - k * self.layout.piece_bytes;
        let len = match self.layout.lens.get(index) {
            Some(&len) if index < pieces.end && (from as u64) < len => {
                usize::try_from(len).unwrap_or(usize::MAX)
            }
            _ => {
                return Err(Error::Order(format!(
                    "unit {unit}'s parameter shard in {} ends before byte {at}",
                    self.tier.path().display()
                )))
            }
        };
        Ok((index, from, len))
    }
}
