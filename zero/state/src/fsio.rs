//! File I/O shared by training states and the file formats of the crates that use this one
//! (zero-train's token files, llm.c checkpoints and safetensors exports): reading a prefix of
//! a stream, and durable atomic replacement of a file.
//!
//! A file is replaced in four steps: write `<path>.tmp`, fsync it, rename it over `path`,
//! fsync the directory. The last step is what makes the rename itself survive a power cut
//! (POSIX keeps directory entries in the directory, not in the file); without it a crash
//! after `save` returned could bring back the old file, or none.

use std::fs::File;
use std::io::{BufWriter, Read};
use std::path::{Path, PathBuf};

use crate::IoError;

/// `map_err` adapter: `file.sync_all().map_err(failed("sync", &path))`: the one way this
/// crate and its users turn an I/O failure into an [`IoError`] naming the operation and the
/// path (each error enum converts an `IoError` with `?`).
pub fn failed(op: &'static str, path: impl AsRef<Path>) -> impl FnOnce(std::io::Error) -> IoError {
    let path = path.as_ref().to_path_buf();
    move |source| IoError { op, path, source }
}

/// Fills `buf` as far as the reader allows; returns the bytes read (short only at EOF).
///
/// # Errors
/// The reader's error, other than `Interrupted` (retried).
pub fn read_up_to(reader: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// `path` with `suffix` appended to its last component (`model.bin` -> `model.bin.tmp`).
pub fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// Fsyncs the directory holding `path`, so a rename or creation inside it is durable.
///
/// # Errors
/// Opening or syncing the directory.
pub fn sync_parent(path: &Path) -> Result<(), IoError> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    sync_dir(parent)
}

/// Fsyncs a directory's entries.
///
/// # Errors
/// Opening or syncing the directory.
pub fn sync_dir(dir: &Path) -> Result<(), IoError> {
    let handle = File::open(dir).map_err(failed("open directory", dir))?;
    handle.sync_all().map_err(failed("sync directory", dir))
}

/// Creates `path`, lets `fill` write it through a buffer, flushes and fsyncs it.
///
/// # Errors
/// Creating, writing (including `fill`'s own error) or syncing.
pub fn create_synced(
    path: &Path,
    fill: impl FnOnce(&mut BufWriter<File>) -> std::io::Result<()>,
) -> Result<(), IoError> {
    let file = File::create(path).map_err(failed("create", path))?;
    let mut writer = BufWriter::new(file);
    fill(&mut writer).map_err(failed("write", path))?;
    let file = writer
        .into_inner()
        .map_err(|e| failed("write", path)(e.into_error()))?;
    file.sync_all().map_err(failed("sync", path))
}

/// Replaces `path` durably with what `fill` writes: `<path>.tmp`, fsync, rename, fsync of
/// the directory. On failure the temporary file is removed and `path` is untouched.
///
/// # Errors
/// The first failing step, naming its path.
pub fn write_atomic(
    path: &Path,
    fill: impl FnOnce(&mut BufWriter<File>) -> std::io::Result<()>,
) -> Result<(), IoError> {
    let tmp = with_suffix(path, ".tmp");
    if let Err(e) = create_synced(&tmp, fill) {
        // Best effort: the write already failed, and that is the error worth reporting.
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, path).map_err(failed("rename into", path))?;
    sync_parent(path)
}

/// True for a name that stays in its folder: not empty, no separator, not `.` or `..`.
pub fn is_plain_file_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\\', '\0'])
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A reader that hands out one byte per call and is interrupted every other call.
    struct Trickle<'a> {
        data: &'a [u8],
        interrupt: bool,
    }

    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            self.interrupt = !self.interrupt;
            if self.interrupt {
                return Err(std::io::ErrorKind::Interrupted.into());
            }
            match (self.data.split_first(), buf.first_mut()) {
                (Some((&b, rest)), Some(slot)) => {
                    *slot = b;
                    self.data = rest;
                    Ok(1)
                }
                _ => Ok(0),
            }
        }
    }

    #[test]
    fn read_up_to_fills_across_short_and_interrupted_reads_and_stops_at_eof() {
        let mut r = Trickle {
            data: &[1, 2, 3],
            interrupt: false,
        };
        let mut buf = [0u8; 5];
        assert_eq!(read_up_to(&mut r, &mut buf).ok(), Some(3));
        assert_eq!(buf, [1, 2, 3, 0, 0]);
    }

    #[test]
    fn failed_write_leaves_the_old_file_and_no_temporary() {
        let dir = std::env::temp_dir().join(format!("zero-fsio-{}", std::process::id()));
        std::fs::create_dir_all(&dir).ok();
        let path = dir.join("f.bin");
        assert!(write_atomic(&path, |w| w.write_all(b"old")).is_ok());
        let err = write_atomic(&path, |w| {
            w.write_all(b"new, half")?;
            Err(std::io::Error::other("disk full"))
        });
        assert!(matches!(err, Err(IoError { op: "write", .. })));
        assert_eq!(std::fs::read(&path).ok().as_deref(), Some(&b"old"[..]));
        assert!(!with_suffix(&path, ".tmp").exists());
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn names_that_leave_their_folder_are_not_plain_file_names() {
        assert!(is_plain_file_name("model-00001-of-00002.safetensors"));
        for bad in [
            "",
            ".",
            "..",
            "../x.safetensors",
            "/etc/passwd",
            "a\\b",
            "sub/x",
        ] {
            assert!(!is_plain_file_name(bad), "{bad:?}");
        }
    }
}
