//! The host memory a process may use: `MemAvailable` of `/proc/meminfo`, or the byte count
//! [`HOST_MEMORY_VAR`] states in its place. Pinned buffers, host arenas and whole runs are
//! checked against it before they are made, so a plan that cannot fit is refused instead of
//! swapping.

use crate::bytesize::{ByteSize, ByteSizeError};

/// The environment variable that states the host memory a run may use, in place of
/// `MemAvailable`: for machines whose reading is not what they can give, such as a virtual
/// machine whose memory reads small at first and grows as it is used. A byte count (`100G`).
pub const HOST_MEMORY_VAR: &str = "ZERO_HOST_MEMORY";

/// [`HOST_MEMORY_VAR`]'s text, when it is set and not empty (an empty one counts as unset).
fn host_memory_var() -> Option<String> {
    std::env::var(HOST_MEMORY_VAR)
        .ok()
        .filter(|v| !v.is_empty())
}

/// The byte count [`HOST_MEMORY_VAR`] states, if it is set.
///
/// # Errors
/// When it is set to something that is not a byte count. `zero-train` and `zero-bench` check
/// this at start-up, so [`host_available_bytes`] can rely on it.
pub fn host_memory_override() -> Result<Option<u64>, ByteSizeError> {
    host_memory_var()
        .map(|text| text.parse::<ByteSize>().map(|b| b.0))
        .transpose()
}

/// The memory this machine can give without swapping: [`HOST_MEMORY_VAR`] where set, else
/// `MemAvailable` of `/proc/meminfo`; `None` where neither can be read (not Linux, a
/// malformed line).
#[must_use]
pub fn host_available_bytes() -> Option<u64> {
    if let Ok(Some(bytes)) = host_memory_override() {
        return Some(bytes);
    }
    mem_available(&std::fs::read_to_string("/proc/meminfo").ok()?)
}

/// What [`host_available_bytes`] read, in words for a refusal naming the memory a plan
/// exceeds.
#[must_use]
pub fn host_memory_description() -> &'static str {
    if host_memory_var().is_some() {
        "the host memory ZERO_HOST_MEMORY states"
    } else {
        "this machine's available memory (MemAvailable)"
    }
}

/// What [`host_available_bytes`] read, for messages: the variable's name or `MemAvailable`.
#[must_use]
pub fn host_memory_name() -> &'static str {
    if host_memory_var().is_some() {
        HOST_MEMORY_VAR
    } else {
        "MemAvailable"
    }
}

/// `MemAvailable` of a `/proc/meminfo` text, in bytes.
fn mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?;
    let kib: u64 = line.trim().strip_suffix("kB")?.trim().parse().ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::mem_available;

    #[test]
    fn mem_available_reads_the_kib_line_and_refuses_what_it_cannot_read() {
        let text = "MemTotal:       24596396 kB\nMemFree:  100 kB\nMemAvailable:   23000000 kB\n";
        assert_eq!(mem_available(text), Some(23_000_000 * 1024));
        assert_eq!(mem_available("MemTotal: 5 kB\n"), None);
        assert_eq!(mem_available("MemAvailable: lots kB\n"), None);
        assert_eq!(
            mem_available("MemAvailable: 18446744073709551615 kB\n"),
            None
        );
    }
}
