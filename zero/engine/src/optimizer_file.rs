//! The file tier of ZeRO-Offload (`--offload-optimizer nvme`): a rank's optimizer states
//! (Adam's m and v, and the f32 master weights for half precision) in one zero-alloc
//! [`TierFile`] (tier `optimizer`), laid out piece by piece as
//! [`FileLayout`] says, moved through a fixed [`ChunkPool`].
//!
//! The units' state handles then live in an accounting arena (no memory), which mirrors the
//! file's blocks so that sizes are measured as for the other homes; every read or write of
//! a state goes through [`Engine::read_optim`] / [`Engine::write_optim`], which reach the
//! file here, or the arena that holds the states otherwise. The update streams the file
//! (`optimizer_stream`).

use super::engine::Engine;
use super::error::{Error, Result};
use super::host_io::{read_f32, write_f32};
use super::optimizer_home::OffloadedOptimizer;
use super::optimizer_io::IoThread;
use super::optimizer_stream::StepStream;
use super::planning::offload_plan::FileLayout;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;
use zero_alloc::tier::{ChunkPool, TierFile, TierSpec};
use zero_alloc::Handle;

/// The tier name of the optimizer states' files.
pub const OPTIMIZER_TIER: &str = "optimizer";

/// One of a unit's f32 optimizer states, numbered as the file lays them out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OptimState {
    M = 0,
    V = 1,
    Master = 2,
}

/// A rank's optimizer file, its I/O thread, the caller's pool buffer, the step being
/// streamed and what has moved.
#[derive(Debug)]
pub(crate) struct FileStates {
    pub tier: Arc<TierFile>,
    /// The buffer of reads and writes made on the engine's thread (exports, imports); the
    /// I/O thread has its own.
    pub pool: ChunkPool,
    pub layout: FileLayout,
    pub io: IoThread,
    /// The step being streamed (`optimizer_stream`), if any.
    pub stream: Option<StepStream>,
    /// Bytes read from and written to the file since start-up.
    pub read_bytes: u64,
    pub written_bytes: u64,
    /// Seconds the I/O thread spent reading and writing the step streams' pieces.
    pub io_seconds: (f64, f64),
}

/// What the file tier holds and has moved, for tests and reports.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FileTierStats {
    /// Bytes of the file (header and every piece's slot).
    pub file_bytes: u64,
    /// Bytes of the chunk pool (the I/O thread's buffer and the engine thread's), fixed at
    /// start-up.
    pub pool_bytes: u64,
    /// Bytes of one pool buffer (a piece larger than this moves chunk by chunk).
    pub chunk_bytes: u64,
    /// The largest piece the file holds, in bytes.
    pub largest_piece: u64,
    /// Bytes read from the file since start-up.
    pub read_bytes: u64,
    /// Bytes written to it since start-up (the zeroed file's creation not counted).
    pub written_bytes: u64,
    /// The file bypasses the page cache (`O_DIRECT`).
    pub direct: bool,
    /// Seconds the I/O thread spent in the step streams' reads and writes (the
    /// engine thread's exports and imports not counted): with the bytes the streams moved,
    /// the tier's sustained throughput.
    pub io_seconds: (f64, f64),
    /// Bytes read or written through a pool buffer rather than moved straight, since
    /// start-up (`zero_alloc::tier::TierFile::pooled_bytes`).
    pub pooled_bytes: u64,
}

/// The file is the run's scratch (the states outlive it in checkpoints, not in it), so it
/// goes with the engine rather than fill the disk run after run.
impl Drop for FileStates {
    fn drop(&mut self) {
        // A file already gone, or a folder made read-only since, leaves nothing to do.
        let _ = std::fs::remove_file(self.tier.path());
    }
}

/// Creates `dir`'s file of tier `tier` for `rank` of `world`, zeroed, with pieces of `lens`
/// bytes. A file another run left is replaced (created zeroed), never read: the run value
/// only marks this run's file in its header.
pub(crate) fn create_tier(
    dir: &Path,
    (rank, world): (usize, usize),
    tier: &str,
    lens: &[u64],
) -> Result<TierFile> {
    let run = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
        ^ u64::from(std::process::id());
    let spec = TierSpec {
        dir,
        tier,
        rank: u32::try_from(rank).unwrap_or(u32::MAX),
        world: u32::try_from(world).unwrap_or(u32::MAX),
        run,
    };
    Ok(TierFile::create(spec, lens)?)
}

impl FileStates {
    /// Creates `dir`'s file for `rank` of `world`, zeroed, laid out as `layout` says, and
    /// starts its I/O thread; the pool is two `chunk`-byte buffers, the thread's and the
    /// engine thread's.
    pub fn create(
        dir: &Path,
        (rank, world): (usize, usize),
        layout: FileLayout,
        chunk: usize,
    ) -> Result<Self> {
        let tier = Arc::new(create_tier(
            dir,
            (rank, world),
            OPTIMIZER_TIER,
            &layout.lens,
        )?);
        let thread_pool = ChunkPool::new(1, chunk)?;
        let io = IoThread::spawn(Arc::clone(&tier), layout.clone(), thread_pool)
            .map_err(|e| Error::Order(format!("the optimizer file's I/O thread: {e}")))?;
        Ok(Self {
            tier,
            pool: ChunkPool::new(1, chunk)?,
            layout,
            io,
            stream: None,
            read_bytes: 0,
            written_bytes: 0,
            io_seconds: (0.0, 0.0),
        })
    }

    /// The statistics of [`FileTierStats`].
    pub fn stats(&self) -> FileTierStats {
        FileTierStats {
            file_bytes: self.tier.file_bytes(),
            // The I/O thread's buffer is the same size as the engine thread's.
            pool_bytes: 2 * self.pool.bytes() as u64,
            chunk_bytes: self.pool.chunk() as u64,
            largest_piece: self.layout.lens.iter().copied().max().unwrap_or(0),
            read_bytes: self.read_bytes,
            written_bytes: self.written_bytes,
            direct: self.tier.is_direct(),
            io_seconds: self.io_seconds,
            pooled_bytes: self.tier.pooled_bytes(),
        }
    }

    /// Elements `range` of `unit`'s `state` (kept-range coordinates), read piece by piece.
    pub fn read_range(
        &mut self,
        unit: usize,
        state: OptimState,
        range: Range<usize>,
    ) -> Result<Vec<f32>> {
        let mut out = vec![0f32; range.len()];
        let piece = self.layout.piece;
        let mut at = range.start;
        while at < range.end {
            let k = at / piece;
            let values = self.read_piece(unit, state, k)?;
            let from = at - k * piece;
            let n = (values.len() - from).min(range.end - at);
            out[at - range.start..][..n].copy_from_slice(&values[from..from + n]);
            at += n;
        }
        Ok(out)
    }

    /// Writes `values` into `unit`'s `state` from element `at` on: each piece touched is
    /// written back whole, read first unless `values` cover all of it.
    pub fn write_range(
        &mut self,
        unit: usize,
        state: OptimState,
        at: usize,
        values: &[f32],
    ) -> Result<()> {
        let piece = self.layout.piece;
        let mut done = 0;
        while done < values.len() {
            let k = (at + done) / piece;
            let from = at + done - k * piece;
            let (index, len) = self.piece_at(unit, state, k)?;
            let n = len.saturating_sub(from).min(values.len() - done);
            if n == 0 {
                return Err(Error::Order(format!(
                    "unit {unit}'s optimizer state {} ends before element {}",
                    state as usize,
                    at + done
                )));
            }
            let whole = if from == 0 && n == len {
                values[done..done + n].to_vec()
            } else {
                let mut whole = self.read_piece(unit, state, k)?;
                whole[from..from + n].copy_from_slice(&values[done..done + n]);
                whole
            };
            let bytes = bytemuck::cast_slice(&whole);
            self.tier.write_piece(index, bytes, &mut self.pool)?;
            self.written_bytes += bytes.len() as u64;
            done += n;
        }
        Ok(())
    }

    /// Piece `k` of `unit`'s `state`: its index in the file and its f32 elements.
    fn piece_at(&self, unit: usize, state: OptimState, k: usize) -> Result<(usize, usize)> {
        let index = self.layout.index(unit, k, state as usize);
        let bytes = self.layout.lens.get(index).copied().ok_or_else(|| {
            Error::Order(format!(
                "unit {unit} has no optimizer piece {k} in the file"
            ))
        })?;
        Ok((index, usize::try_from(bytes / 4).unwrap_or(usize::MAX)))
    }

    /// Piece `k` of `unit`'s `state`, whole.
    fn read_piece(&mut self, unit: usize, state: OptimState, k: usize) -> Result<Vec<f32>> {
        let (index, len) = self.piece_at(unit, state, k)?;
        let mut values = vec![0f32; len];
        let bytes = bytemuck::cast_slice_mut(&mut values);
        self.tier.read_piece(index, bytes, &mut self.pool)?;
        self.read_bytes += bytes.len() as u64;
        Ok(values)
    }
}

/// Bytes the rank's files (the optimizer's and the parameters') moved and the seconds their
/// reads and writes took: over a span of steps, the file tier's sustained throughput.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct FileIo {
    /// Bytes read from the files.
    pub read_bytes: u64,
    /// Bytes written to them.
    pub written_bytes: u64,
    /// Seconds spent in those reads.
    pub read_seconds: f64,
    /// Seconds spent in those writes.
    pub write_seconds: f64,
    /// Bytes of those reads and writes copied through a pool buffer rather than moved
    /// straight (`zero_alloc::tier::TierFile::pooled_bytes`).
    pub pooled_bytes: u64,
}

impl FileIo {
    /// What moved between `earlier` and `self`.
    #[must_use]
    pub fn since(self, earlier: Self) -> Self {
        Self {
            read_bytes: self.read_bytes.saturating_sub(earlier.read_bytes),
            written_bytes: self.written_bytes.saturating_sub(earlier.written_bytes),
            read_seconds: self.read_seconds - earlier.read_seconds,
            write_seconds: self.write_seconds - earlier.write_seconds,
            pooled_bytes: self.pooled_bytes.saturating_sub(earlier.pooled_bytes),
        }
    }

    /// `self` and `other` together.
    #[must_use]
    pub fn plus(self, other: Self) -> Self {
        Self {
            read_bytes: self.read_bytes.saturating_add(other.read_bytes),
            written_bytes: self.written_bytes.saturating_add(other.written_bytes),
            read_seconds: self.read_seconds + other.read_seconds,
            write_seconds: self.write_seconds + other.write_seconds,
            pooled_bytes: self.pooled_bytes.saturating_add(other.pooled_bytes),
        }
    }
}

impl Engine {
    /// What the rank's files have moved since start-up (zeros without a file tier); the
    /// optimizer file's seconds are its I/O thread's, counted for the steps' streams.
    pub fn file_io(&self) -> FileIo {
        let optimizer = self.optimizer_file().map_or(FileIo::default(), |s| FileIo {
            read_bytes: s.read_bytes,
            written_bytes: s.written_bytes,
            read_seconds: s.io_seconds.0,
            write_seconds: s.io_seconds.1,
            pooled_bytes: s.pooled_bytes,
        });
        let params = self
            .params_file()
            .map_or(FileIo::default(), |(_, s)| FileIo {
                read_bytes: s.read_bytes,
                written_bytes: s.written_bytes,
                read_seconds: s.io_seconds.0,
                write_seconds: s.io_seconds.1,
                pooled_bytes: s.pooled_bytes,
            });
        optimizer.plus(params)
    }

    /// The file tier's statistics (`None` unless the optimizer states are in a file).
    pub fn optimizer_file(&self) -> Option<FileTierStats> {
        match &self.offloaded {
            Some(o) => Some(o.file.as_ref()?.stats()),
            // A delayed update holds the file: its statistics as they stood when it did
            // (its own reads and writes count once it lands).
            None => self.pending_update.as_ref()?.file_stats,
        }
    }

    /// The optimizer file (`None` unless the optimizer states are in a file).
    pub fn optimizer_file_path(&self) -> Option<&Path> {
        let file = self.offloaded.as_ref()?.file.as_ref()?;
        Some(file.tier.path())
    }

    /// `unit`'s block of `state` in the arena that holds the optimizer states (for the file
    /// tier, its accounting arena's block).
    pub(crate) fn optim_handle(&self, unit: usize, state: OptimState) -> Result<Handle> {
        let b = &self.units.bufs[unit];
        match state {
            OptimState::M => Ok(b.m),
            OptimState::V => Ok(b.v),
            OptimState::Master => b
                .master
                .ok_or_else(|| Error::Order("master weights without half precision".into())),
        }
    }

    /// Elements `range` (in the kept block's coordinates) of `unit`'s `state`, wherever the
    /// optimizer states live.
    pub(crate) fn read_optim(
        &mut self,
        unit: usize,
        state: OptimState,
        range: Range<usize>,
    ) -> Result<Vec<f32>> {
        let h = self.optim_handle(unit, state)?;
        match &mut self.offloaded {
            Some(OffloadedOptimizer {
                file: Some(file),
                arena,
                ..
            }) => {
                file.end_step(arena, None)?;
                file.read_range(unit, state, range)
            }
            _ => read_f32(self.optimizer_arena(), h, range),
        }
    }

    /// Writes `values` into `unit`'s `state` from element `at` (kept-block coordinates) on,
    /// wherever the optimizer states live.
    pub(crate) fn write_optim(
        &mut self,
        unit: usize,
        state: OptimState,
        at: usize,
        values: &[f32],
    ) -> Result<()> {
        let h = self.optim_handle(unit, state)?;
        match &mut self.offloaded {
            Some(OffloadedOptimizer {
                file: Some(file),
                arena,
                ..
            }) => {
                file.end_step(arena, None)?;
                file.write_range(unit, state, at, values)
            }
            _ => write_f32(self.optimizer_home().arena, h, at, values),
        }
    }
}
