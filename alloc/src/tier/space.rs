//! A tier file's bytes reserved on its disk when it is created, so that a disk without room
//! refuses the run at start-up, naming the bytes, instead of failing a write in a later
//! step: once reserved, the file's writes overwrite blocks it owns.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;

/// Reserves the first `len` bytes of `file` on its disk (Linux `fallocate`, mode 0). Where
/// the filesystem cannot reserve, the file stays sparse: `fallocate` never falls back to
/// writing zeros, which for a file larger than the disk would fill it.
///
/// # Errors
/// The OS error, `ENOSPC` among them.
pub(super) fn reserve(file: &File, len: u64) -> std::io::Result<()> {
    let Ok(len) = libc::off_t::try_from(len) else {
        return Err(std::io::Error::from_raw_os_error(libc::EFBIG));
    };
    if len == 0 {
        return Ok(());
    }
    // SAFETY: `fallocate` only reads the descriptor, which `file` keeps open during the call.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len) };
    if rc == 0 {
        return Ok(());
    }
    let err = std::io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::EOPNOTSUPP | libc::ENOSYS) => Ok(()),
        _ => Err(err),
    }
}

/// Bytes an unprivileged writer may still use on the filesystem holding `path`, where the
/// OS tells.
pub fn available(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: `statvfs` is all zeroes when uninitialised (plain integers), and the call
    // only reads the NUL-terminated path and writes the struct it is given.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above; both pointers are valid for the call.
    let rc = unsafe { libc::statvfs(c_path.as_ptr(), &mut st) };
    // `fsblkcnt_t` and `c_ulong` are narrower than u64 on some targets.
    #[allow(clippy::useless_conversion)]
    let free = u64::from(st.f_bavail).saturating_mul(u64::from(st.f_frsize));
    (rc == 0).then_some(free)
}
