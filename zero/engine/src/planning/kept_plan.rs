//! Where a model's kept inputs live (activation checkpointing's saved tensors) and the bytes
//! each tier holds: the one rule the plan counts and the engine's store
//! ([`crate::kept`]) allocates by.
//!
//! In the arena, each kept input has a block of its own. Offloaded (ZeRO-R's checkpoint
//! offload), each has a pinned host buffer and the arena holds [`STAGING_SLOTS`] blocks
//! (fewer when there are fewer kept inputs), the staging slots every copy goes through.

use super::plan::block_bytes;
use crate::error::Result;

/// Arena slots of one kept input when kept inputs are offloaded: one written by the model or
/// copied out while the other is fetched or read. A program's derived calls never need more
/// ([`Schedule::check`](super::schedule::Schedule) refuses calls that would).
pub const STAGING_SLOTS: usize = 2;

/// How a model's kept inputs are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KeptInputs {
    /// f32 elements of one kept input (every kept input of the model has this length).
    pub len: usize,
    /// In pinned host memory, staged through [`STAGING_SLOTS`] arena blocks; else each in
    /// an arena block of its own.
    pub offload: bool,
}

impl KeptInputs {
    /// Arena blocks for `count` kept inputs stored this way.
    pub fn arena_blocks(self, count: usize) -> usize {
        if self.offload {
            STAGING_SLOTS.min(count)
        } else {
            count
        }
    }

    /// Bytes of one kept input.
    ///
    /// # Errors
    /// A length whose bytes overflow.
    pub fn input_bytes(self) -> Result<usize> {
        self.len.checked_mul(4).ok_or_else(|| {
            crate::Error::Order(format!("a kept input of {} f32 overflows", self.len))
        })
    }

    /// (arena, host) bytes of `count` kept inputs stored this way, arena blocks rounded as
    /// the arena rounds them.
    ///
    /// # Errors
    /// Sizes that overflow.
    pub fn bytes(self, count: usize) -> Result<(u64, u64)> {
        if count == 0 {
            return Ok((0, 0));
        }
        let one = self.input_bytes()? as u64;
        let overflow = || crate::Error::Order("kept input bytes overflow".into());
        let arena = block_bytes(one)?
            .checked_mul(self.arena_blocks(count) as u64)
            .ok_or_else(overflow)?;
        let host = match self.offload {
            true => one.checked_mul(count as u64).ok_or_else(overflow)?,
            false => 0,
        };
        Ok((arena, host))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offload_keeps_two_slots_in_the_arena_and_every_input_on_the_host() {
        // 64 f32 = 256 bytes, one arena alignment.
        let arena = KeptInputs {
            len: 64,
            offload: false,
        };
        assert_eq!(arena.bytes(5).unwrap(), (5 * 256, 0));
        let host = KeptInputs {
            offload: true,
            ..arena
        };
        assert_eq!(host.bytes(5).unwrap(), (2 * 256, 5 * 256));
        assert_eq!(host.bytes(1).unwrap(), (256, 256));
        assert_eq!(host.bytes(0).unwrap(), (0, 0));
        let huge = KeptInputs {
            len: usize::MAX,
            offload: true,
        };
        assert!(huge.bytes(1).is_err());
    }
}
