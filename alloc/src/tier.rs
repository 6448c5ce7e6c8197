//! The file tier (ZeRO-Infinity's NVMe offload): one file per rank and tier, holding pieces
//! of states at fixed offsets, read and written with positioned I/O through a fixed pool of
//! aligned pinned buffers.
//!
//! Layout: a [`HEADER_BYTES`] header ([`TierHeader`]: rank, tier, run, layout), then one slot
//! per piece, each rounded up to [`TIER_ALIGN`] bytes, so every read and write starts and ends
//! on a block boundary and the file can be opened with `O_DIRECT` (bypassing the page cache,
//! which would otherwise hold a second copy of states meant to leave memory); where the
//! filesystem refuses `O_DIRECT` (tmpfs), the file is opened buffered and says so
//! ([`TierFile::is_direct`]).
//!
//! A piece is moved a chunk at a time, straight from and into the caller's memory where
//! direct I/O takes it (module `direct`), else through one buffer of the pool
//! ([`ChunkPool`]); a piece larger than a buffer is chunked, never refused, and the memory
//! the tier uses besides the file is the pool's, fixed at start-up.
//!
//! Why positioned I/O rather than a memory map (memmap2): a map's page faults read on the
//! computing thread at the kernel's pace, its dirty pages are written back when the kernel
//! decides, a map larger than memory competes with the arena for the same RAM, and an I/O
//! error arrives as SIGBUS rather than an error value.
//!
//! Refused with the file's path and what was expected: a header of another run, rank, tier or
//! layout, a file shorter than its layout, a piece of another length.

mod direct;
mod header;
mod space;

pub use header::{TierHeader, HEADER_BYTES};
pub use space::available as available_bytes;

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{AllocError, Result};
use crate::PinnedBuffer;

/// Alignment of every piece's slot and of every read and write: the largest logical block
/// size `O_DIRECT` asks for on common devices.
pub const TIER_ALIGN: usize = 4096;

/// Where and whose a tier file is.
#[derive(Debug, Clone, Copy)]
pub struct TierSpec<'a> {
    /// The folder (`--nvme-path`).
    pub dir: &'a Path,
    /// The tier's name, at most 16 bytes (`optimizer`, `params`).
    pub tier: &'a str,
    /// The rank, in a group of `world`.
    pub rank: u32,
    /// The group's size.
    pub world: u32,
    /// A value the run draws at start-up, so that a file another run left is refused.
    pub run: u64,
}

/// A fixed set of page-aligned pinned buffers of one chunk size, the only memory the tier's
/// I/O goes through.
#[derive(Debug)]
pub struct ChunkPool {
    buffers: Vec<PinnedBuffer>,
    chunk: usize,
}

impl ChunkPool {
    /// `count` buffers of `chunk` bytes, rounded up to [`TIER_ALIGN`].
    ///
    /// # Errors
    /// [`AllocError::InvalidConfig`] for no buffer or a chunk of 0 bytes; memory errors.
    pub fn new(count: usize, chunk: usize) -> Result<Self> {
        if count == 0 || chunk == 0 {
            return Err(AllocError::InvalidConfig {
                reason: format!("a tier's chunk pool needs buffers of bytes ({count} x {chunk})"),
            });
        }
        let chunk = chunk
            .checked_next_multiple_of(TIER_ALIGN)
            .ok_or(AllocError::SizeOverflow {
                count: chunk,
                elem_size: 1,
            })?;
        let buffers = (0..count)
            .map(|_| PinnedBuffer::new(chunk))
            .collect::<Result<_>>()?;
        Ok(Self { buffers, chunk })
    }

    /// Bytes of one buffer.
    pub fn chunk(&self) -> usize {
        self.chunk
    }

    /// Bytes of every buffer together.
    pub fn bytes(&self) -> usize {
        self.chunk * self.buffers.len()
    }
}

/// One rank's file of one tier (module docs).
#[derive(Debug)]
pub struct TierFile {
    file: File,
    path: PathBuf,
    header: TierHeader,
    /// Each piece's (offset in the file, length in bytes).
    pieces: Vec<(u64, u64)>,
    direct: bool,
    /// The memory alignment direct I/O asks of a caller's buffer (module `direct`).
    memory_align: usize,
    /// Bytes of pieces moved through the pool's buffer since the file was opened.
    pooled: AtomicU64,
}

impl TierFile {
    /// Creates (or replaces) `spec`'s file for pieces of `lens` bytes, zeroed, and holds an
    /// exclusive lock on it while it is open.
    ///
    /// # Errors
    /// [`AllocError::TierIo`] when the file cannot be created or sized, or another
    /// `TierFile` (in this process or another) holds it; [`AllocError::TierNoSpace`] when
    /// its disk cannot hold its bytes; a tier name over 16 bytes; sizes that overflow.
    pub fn create(spec: TierSpec<'_>, lens: &[u64]) -> Result<Self> {
        let (header, pieces) = layout(spec, lens)?;
        let path = file_path(spec);
        let (file, direct) = open_file(&path, true)?;
        let tier = Self {
            memory_align: direct::memory_alignment(&file, direct),
            file,
            path,
            header,
            pieces,
            direct,
            pooled: AtomicU64::new(0),
        };
        // Claimed before it is emptied: a second engine given the same folder, rank and
        // tier while the first runs (another run, or a test beside it) is refused here
        // instead of truncating the first one's states under it. The lock goes with the
        // file handle.
        lock_exclusive(&tier.file).map_err(|e| {
            let op = match e.kind() {
                std::io::ErrorKind::WouldBlock => "claim (another engine holds it)",
                _ => "lock the tier file",
            };
            tier.io_error(op)(e)
        })?;
        let total = HEADER_BYTES as u64 + header.payload;
        tier.file
            .set_len(0)
            .and_then(|()| tier.file.set_len(total))
            .map_err(tier.io_error("size the tier file"))?;
        tier.reserve(total)?;
        tier.write_header()?;
        Ok(tier)
    }

    /// Opens `spec`'s existing file, which must hold pieces of `lens` bytes for the same run.
    ///
    /// # Errors
    /// [`AllocError::TierMismatch`] naming the first field that differs (tier, rank, run,
    /// layout, length) or why the header is unreadable; [`AllocError::TierIo`].
    pub fn open(spec: TierSpec<'_>, lens: &[u64]) -> Result<Self> {
        let (want, pieces) = layout(spec, lens)?;
        let path = file_path(spec);
        let (file, direct) = open_file(&path, false)?;
        let tier = Self {
            path,
            header: want,
            pieces,
            memory_align: direct::memory_alignment(&file, direct),
            file,
            direct,
            pooled: AtomicU64::new(0),
        };
        tier.check_header()?;
        let len = tier.file.metadata().map_err(tier.io_error("stat"))?.len();
        let expected = HEADER_BYTES as u64 + want.payload;
        if len != expected {
            return Err(tier.mismatch("file length", expected, len));
        }
        Ok(tier)
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file bypasses the page cache (`O_DIRECT`).
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// The alignment of memory that moves straight to and from the file, without the
    /// pool's copy (module `direct`): what the kernel asks for direct I/O, or 1 for a
    /// buffered file.
    pub fn memory_alignment(&self) -> usize {
        self.memory_align
    }

    /// Bytes of pieces read or written through the pool's buffer since the file was opened:
    /// a piece's last partial 4 KiB block, and all of a piece whose memory direct I/O
    /// refuses (not aligned to [`TierFile::memory_alignment`]).
    pub fn pooled_bytes(&self) -> u64 {
        self.pooled.load(Ordering::Relaxed)
    }

    /// Bytes of the file (header and every slot).
    pub fn file_bytes(&self) -> u64 {
        HEADER_BYTES as u64 + self.header.payload
    }

    /// Writes `data`, all of piece `piece`, a chunk at a time: straight from `data` where
    /// direct I/O takes its memory, through `pool`'s buffer otherwise (module `direct`).
    ///
    /// # Errors
    /// A piece past the layout or `data` of another length; [`AllocError::TierIo`].
    pub fn write_piece(&self, piece: usize, data: &[u8], pool: &mut ChunkPool) -> Result<()> {
        let (offset, len) = self.piece(piece, data.len())?;
        let straight = direct::straight_bytes(data.as_ptr(), len, self.memory_align);
        for at in (0..straight).step_by(pool.chunk) {
            let n = (straight - at).min(pool.chunk);
            self.write_at(&data[at..at + n], offset + at as u64)?;
        }
        let buf = pool.buffers[0].as_bytes_mut();
        for at in (straight..len).step_by(pool.chunk) {
            let n = (len - at).min(pool.chunk);
            let slot = n.next_multiple_of(TIER_ALIGN);
            buf[..n].copy_from_slice(&data[at..at + n]);
            buf[n..slot].fill(0);
            self.write_at(&buf[..slot], offset + at as u64)?;
            self.pooled.fetch_add(n as u64, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Reads piece `piece` into `out`, all of it, a chunk at a time: straight into `out`
    /// where direct I/O takes its memory, through `pool`'s buffer otherwise.
    ///
    /// # Errors
    /// A piece past the layout or `out` of another length; [`AllocError::TierMismatch`] when
    /// the file has become shorter than its layout; [`AllocError::TierIo`].
    pub fn read_piece(&self, piece: usize, out: &mut [u8], pool: &mut ChunkPool) -> Result<()> {
        let (offset, len) = self.piece(piece, out.len())?;
        let straight = direct::straight_bytes(out.as_ptr(), len, self.memory_align);
        for at in (0..straight).step_by(pool.chunk) {
            let n = (straight - at).min(pool.chunk);
            self.read_at(&mut out[at..at + n], offset + at as u64)?;
        }
        let buf = pool.buffers[0].as_bytes_mut();
        for at in (straight..len).step_by(pool.chunk) {
            let n = (len - at).min(pool.chunk);
            let slot = n.next_multiple_of(TIER_ALIGN);
            self.read_at(&mut buf[..slot], offset + at as u64)?;
            out[at..at + n].copy_from_slice(&buf[..n]);
            self.pooled.fetch_add(n as u64, Ordering::Relaxed);
        }
        Ok(())
    }

    fn write_at(&self, bytes: &[u8], at: u64) -> Result<()> {
        self.file
            .write_all_at(bytes, at)
            .map_err(self.io_error("write a piece"))
    }

    /// Fills `bytes` from `at`; a file that ends first has been shortened behind the tier.
    fn read_at(&self, bytes: &mut [u8], at: u64) -> Result<()> {
        self.file
            .read_exact_at(bytes, at)
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::UnexpectedEof => {
                    let len = self.file.metadata().map_or(0, |m| m.len());
                    self.mismatch("file length", self.file_bytes(), len)
                }
                _ => self.io_error("read a piece")(e),
            })
    }

    /// Piece `piece`'s offset, checking that it exists and is `len` bytes.
    fn piece(&self, piece: usize, len: usize) -> Result<(u64, usize)> {
        let &(offset, want) = self
            .pieces
            .get(piece)
            .ok_or_else(|| AllocError::InvalidConfig {
                reason: format!(
                    "{}: no piece {piece} (it holds {})",
                    self.path.display(),
                    self.pieces.len()
                ),
            })?;
        if want != len as u64 {
            return Err(AllocError::LengthMismatch {
                src: len,
                dst: usize::try_from(want).unwrap_or(usize::MAX),
            });
        }
        Ok((offset, len))
    }

    fn write_header(&self) -> Result<()> {
        let mut buf = PinnedBuffer::new(HEADER_BYTES)?;
        buf.as_bytes_mut().copy_from_slice(&self.header.encode());
        self.file
            .write_all_at(buf.as_bytes(), 0)
            .map_err(self.io_error("write the header"))
    }

    fn check_header(&self) -> Result<()> {
        let mut buf = PinnedBuffer::new(HEADER_BYTES)?;
        let read = self.file.read_exact_at(buf.as_bytes_mut(), 0);
        if read.is_err() {
            return Err(self.mismatch("header", "a tier header", "a file shorter than one"));
        }
        let found = TierHeader::decode(buf.as_bytes())
            .map_err(|why| self.mismatch("header", self.header, why))?;
        match found.first_difference(&self.header) {
            Some((what, expected, found)) => Err(self.mismatch(what, expected, found)),
            None => Ok(()),
        }
    }

    fn mismatch(
        &self,
        what: &'static str,
        expected: impl ToString,
        found: impl ToString,
    ) -> AllocError {
        AllocError::TierMismatch {
            path: self.path.clone(),
            what,
            expected: expected.to_string(),
            found: found.to_string(),
        }
    }

    /// Reserves the file's `total` bytes on its disk ([`space::reserve`]); a disk without
    /// room is [`AllocError::TierNoSpace`], naming the bytes, and the file (just emptied,
    /// perhaps partly reserved) is removed before the free bytes are read.
    ///
    /// A file the disk's free bytes cannot hold is refused before `fallocate` runs: ext4
    /// keeps the blocks a failed `fallocate` took until the file is removed, so asking for
    /// more than is free would fill the disk, for a moment, under every other writer on it.
    fn reserve(&self, total: u64) -> Result<()> {
        let no_space = |available| {
            // The refusal explains more than a failure to remove after it.
            let _ = std::fs::remove_file(&self.path);
            AllocError::TierNoSpace {
                path: self.path.clone(),
                bytes: total,
                available,
            }
        };
        let free = self.path.parent().and_then(space::available);
        if free.is_some_and(|free| free < total) {
            return Err(no_space(free));
        }
        match space::reserve(&self.file, total) {
            Ok(()) => Ok(()),
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EFBIG)) => {
                Err(no_space(self.path.parent().and_then(space::available)))
            }
            Err(e) => Err(self.io_error("reserve the tier file's bytes")(e)),
        }
    }

    fn io_error(&self, op: &'static str) -> impl FnOnce(std::io::Error) -> AllocError + '_ {
        move |source| AllocError::TierIo {
            path: self.path.clone(),
            op,
            source,
        }
    }
}

/// Bytes of a tier file holding pieces of `lens` bytes: the header and every piece's slot
/// rounded up to [`TIER_ALIGN`] (what [`TierFile::file_bytes`] measures, for planners that
/// open no file).
///
/// # Errors
/// [`AllocError::SizeOverflow`] when the sizes overflow.
pub fn file_bytes(lens: &[u64]) -> Result<u64> {
    let mut at = HEADER_BYTES as u64;
    for &len in lens {
        at = next_slot(at, len, lens.len())?;
    }
    Ok(at)
}

/// The offset after the slot of a piece of `len` bytes that starts at `at`.
fn next_slot(at: u64, len: u64, pieces: usize) -> Result<u64> {
    len.checked_next_multiple_of(TIER_ALIGN as u64)
        .and_then(|slot| at.checked_add(slot))
        .ok_or(AllocError::SizeOverflow {
            count: pieces,
            elem_size: TIER_ALIGN,
        })
}

/// `spec`'s header and each piece's (offset, length) for pieces of `lens` bytes.
fn layout(spec: TierSpec<'_>, lens: &[u64]) -> Result<(TierHeader, Vec<(u64, u64)>)> {
    let mut tier = [0u8; 16];
    let name = spec.tier.as_bytes();
    if name.len() > tier.len() {
        return Err(AllocError::InvalidConfig {
            reason: format!("tier name {:?} is longer than 16 bytes", spec.tier),
        });
    }
    tier[..name.len()].copy_from_slice(name);
    let mut at = HEADER_BYTES as u64;
    let mut pieces = Vec::with_capacity(lens.len());
    for &len in lens {
        pieces.push((at, len));
        at = next_slot(at, len, lens.len())?;
    }
    let layout = lens.iter().fold(header::FNV_OFFSET, |h, len| {
        header::fnv1a(h, &len.to_le_bytes())
    });
    let header = TierHeader {
        rank: spec.rank,
        world: spec.world,
        tier,
        run: spec.run,
        pieces: lens.len() as u64,
        layout,
        payload: at - HEADER_BYTES as u64,
    };
    Ok((header, pieces))
}

/// `spec`'s file: one per rank and tier in the folder.
fn file_path(spec: TierSpec<'_>) -> PathBuf {
    spec.dir
        .join(format!("zero-{}-rank{}.tier", spec.tier, spec.rank))
}

/// Takes an exclusive advisory lock on `file` (`flock`) without waiting; it lasts while the
/// file is open.
fn lock_exclusive(file: &File) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: `flock` only reads the descriptor, which `file` keeps open during the call.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// `path` opened for reading and writing (created when `create`, but not emptied: the
/// caller claims it first), with `O_DIRECT` where the filesystem takes it; returns whether
/// it did.
fn open_file(path: &Path, create: bool) -> Result<(File, bool)> {
    let open = |direct: bool| {
        let mut options = OpenOptions::new();
        options
            .read(true)
            .write(true)
            .create(create)
            .truncate(false);
        if direct {
            options.custom_flags(libc::O_DIRECT);
        }
        options.open(path)
    };
    match open(true) {
        Ok(file) => Ok((file, true)),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => open(false).map(|f| (f, false)),
        Err(e) => Err(e),
    }
    .map_err(|source| AllocError::TierIo {
        path: path.to_path_buf(),
        op: if create { "create" } else { "open" },
        source,
    })
}
