//! Moving a piece's bytes straight between the caller's memory and the file, without the
//! pool's buffer, where direct I/O accepts that memory: its address a multiple of the
//! alignment the kernel reports for the file (`statx`'s `dio_mem_align`). The pool carries
//! what it cannot: a piece's last partial block (its slot is padded with zeros) and memory
//! the kernel would refuse. What the saved copy is worth is measured in docs/zero.md ("A
//! model larger than memory").

use std::fs::File;
use std::os::fd::AsRawFd;

use super::TIER_ALIGN;

/// The alignment direct I/O asks of memory for `file`: what the kernel reports (a power of
/// two), else [`TIER_ALIGN`]; 1 when the file goes through the page cache (`direct` false).
pub(super) fn memory_alignment(file: &File, direct: bool) -> usize {
    if !direct {
        return 1;
    }
    // SAFETY: `statx` is plain integers, valid when all zeroes.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: the empty path with `AT_EMPTY_PATH` names the descriptor, which `file` keeps
    // open during the call; the call writes only the struct it is given.
    let rc = unsafe {
        libc::statx(
            file.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_DIOALIGN,
            &mut stx,
        )
    };
    let reported = rc == 0 && stx.stx_mask & libc::STATX_DIOALIGN != 0;
    match usize::try_from(stx.stx_dio_mem_align) {
        Ok(align) if reported && align.is_power_of_two() => align,
        _ => TIER_ALIGN,
    }
}

/// Bytes at the front of the `len` bytes at `addr` that move straight: whole
/// [`TIER_ALIGN`] blocks when `addr` is a multiple of `align`, none otherwise.
pub(super) fn straight_bytes(addr: *const u8, len: usize, align: usize) -> usize {
    if (addr as usize) % align == 0 {
        len - len % TIER_ALIGN
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_whole_blocks_of_aligned_memory_move_straight() {
        let at = |addr: usize| std::ptr::without_provenance::<u8>(addr);
        assert_eq!(
            straight_bytes(at(8192), 3 * TIER_ALIGN + 5, 512),
            3 * TIER_ALIGN
        );
        assert_eq!(straight_bytes(at(8192 + 512), TIER_ALIGN, 512), TIER_ALIGN);
        assert_eq!(straight_bytes(at(8192 + 256), 5 * TIER_ALIGN, 512), 0);
        assert_eq!(straight_bytes(at(8192), TIER_ALIGN - 1, 512), 0);
        assert_eq!(straight_bytes(at(3), 2 * TIER_ALIGN, 1), 2 * TIER_ALIGN);
    }
}
