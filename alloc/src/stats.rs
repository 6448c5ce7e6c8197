//! Arena statistics: exact byte counts and event counters.

use std::fmt;

/// A snapshot of an arena's accounting. Every figure is exact (no sampling).
///
/// Byte figures count the space blocks occupy, i.e. requests rounded up to the arena's
/// alignment, so `allocated + total_free == capacity` always holds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stats {
    /// The capacity cap in bytes.
    pub capacity: usize,
    /// Bytes occupied by live blocks.
    pub allocated: usize,
    /// Bytes of the reservation ever touched: the highest end offset any block has reached.
    /// The host reservation is lazily committed, so this bounds the memory really in use.
    pub reserved: usize,
    /// Highest `allocated` since creation or the last [`reset_peak`](crate::Arena::reset_peak).
    pub peak_allocated: usize,
    /// Size of the largest free hole.
    pub largest_free: usize,
    /// Sum of all free holes.
    pub total_free: usize,
    /// `1 - largest_free / total_free` (0 when nothing is free).
    pub fragmentation: f64,
    /// Number of live blocks.
    pub live_blocks: usize,
    /// Number of live blocks pinned by in-flight operations.
    pub pinned_blocks: usize,
    /// Successful allocations.
    pub allocs: u64,
    /// Frees.
    pub frees: u64,
    /// Defragmentations run (explicit or automatic).
    pub defrags: u64,
    /// Bytes moved by defragmentations.
    pub bytes_moved: u64,
    /// Allocations refused for lack of memory.
    pub ooms: u64,
}

impl Stats {
    /// `1 - largest_free / total_free`, 0 when nothing is free.
    #[must_use]
    pub fn fragmentation_of(largest_free: usize, total_free: usize) -> f64 {
        if total_free == 0 {
            0.0
        } else {
            1.0 - largest_free as f64 / total_free as f64
        }
    }
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = |n: usize| human_bytes(n as u64);
        writeln!(
            f,
            "  allocated {} of capacity {} (peak {}, reserved {})",
            b(self.allocated),
            b(self.capacity),
            b(self.peak_allocated),
            b(self.reserved)
        )?;
        writeln!(
            f,
            "  free {} in holes, largest {} (fragmentation {:.1}%)",
            b(self.total_free),
            b(self.largest_free),
            self.fragmentation * 100.0
        )?;
        write!(
            f,
            "  {} live blocks ({} pinned); {} allocs, {} frees, {} defrags moving {}, {} OOMs",
            self.live_blocks,
            self.pinned_blocks,
            self.allocs,
            self.frees,
            self.defrags,
            human_bytes(self.bytes_moved),
            self.ooms
        )
    }
}

/// Formats a byte count with binary units, e.g. `1.50 GiB`.
#[must_use]
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.2} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_bytes_uses_binary_units() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1536), "1.50 KiB");
        assert_eq!(human_bytes(80 << 30), "80.00 GiB");
    }

    #[test]
    fn fragmentation_is_zero_when_nothing_free() {
        assert_eq!(Stats::fragmentation_of(0, 0), 0.0);
        assert!((Stats::fragmentation_of(25, 100) - 0.75).abs() < 1e-12);
    }
}
