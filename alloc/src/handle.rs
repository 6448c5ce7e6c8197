//! Handles: the only way to name a block.
//!
//! A handle is a (arena id, slot, generation) triple rather than a pointer so that a
//! defragmentation can move the block underneath it, and so that a freed or foreign handle is
//! detected instead of silently aliasing whatever now occupies the slot.

use std::sync::atomic::{AtomicU64, Ordering};

/// Names one live block of one arena. Cheap to copy; resolve it with
/// [`Arena::block`](crate::Arena::block).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Handle {
    pub(crate) arena: u64,
    pub(crate) slot: u32,
    pub(crate) generation: u32,
}

impl Handle {
    /// Id of the arena that made this handle.
    #[must_use]
    pub fn arena_id(self) -> u64 {
        self.arena
    }
}

/// Where a block currently lies: byte offset from the arena's start, and requested length.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Block {
    /// Byte offset from the start of the arena (a multiple of the arena's alignment).
    pub offset: usize,
    /// Bytes requested at allocation.
    pub len: usize,
    /// Bytes the block occupies (`len` rounded up to the alignment, at least one unit).
    pub size: usize,
}

/// Hands out process-unique arena ids so handles cannot cross arenas.
pub(crate) fn next_arena_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}
