//! Where a model's kept inputs live (activation checkpointing's saved tensors) and the bytes
//! each tier holds: the one rule the plan counts and the engine's store
//! ([`crate::kept`]) allocates by.
//!
//! In the arena, each kept input has a block of its own. Offloaded (ZeRO-R's checkpoint
//! offload), each has a pinned host buffer and the arena holds [`STAGING_SLOTS`] blocks
//! (fewer when there are fewer kept inputs), the staging slots every copy goes through.
//!
//! Partitioned over a tensor-parallel group of P ranks (ZeRO-R's P_a), each kept input is
//! stored as this rank's slice of `ceil(len / P)` elements (the input padded to P slices),
//! in an arena block of its own or, offloaded, in a pinned host buffer; the arena also holds
//! one whole-input buffer of `P x slice` elements for each kept input a pass holds at once
//! ([`Schedule::kept_held`](super::schedule::Schedule::kept_held)): the operation writes
//! into one, and the slices are all-gathered into one before the restoring operation reads
//! it.

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
    /// Ranks of the tensor-parallel group each kept input is partitioned over (P_a); 0 or 1:
    /// each rank stores whole inputs.
    pub partitions: usize,
}

impl KeptInputs {
    /// Each kept input is stored as slices over more than one rank (P_a).
    pub fn partitioned(self) -> bool {
        self.partitions > 1
    }

    /// f32 elements this rank stores of one kept input: its slice when partitioned (the
    /// input padded to a multiple of the partitions), else the whole input.
    pub fn stored_len(self) -> usize {
        match self.partitioned() {
            true => self.len.div_ceil(self.partitions),
            false => self.len,
        }
    }

    /// f32 elements of a whole-input buffer of a partitioned store: every rank's slice.
    pub fn gathered_len(self) -> usize {
        self.stored_len() * self.partitions.max(1)
    }

    /// Arena blocks for `count` kept inputs stored whole this way.
    pub fn arena_blocks(self, count: usize) -> usize {
        if self.offload {
            STAGING_SLOTS.min(count)
        } else {
            count
        }
    }

    /// Bytes of `len` f32.
    fn f32_bytes(len: usize) -> Result<u64> {
        len.checked_mul(4)
            .map(|b| b as u64)
            .ok_or_else(|| crate::Error::Order(format!("a kept input of {len} f32 overflows")))
    }

    /// Bytes this rank stores of one kept input ([`KeptInputs::stored_len`]).
    ///
    /// # Errors
    /// A length whose bytes overflow.
    pub fn input_bytes(self) -> Result<usize> {
        Ok(Self::f32_bytes(self.stored_len())? as usize)
    }

    /// (arena, host) bytes of `count` kept inputs stored this way by passes holding at most
    /// `held` of them at once (whole-input buffers of a partitioned store), arena blocks
    /// rounded as the arena rounds them.
    ///
    /// # Errors
    /// Sizes that overflow.
    pub fn bytes(self, count: usize, held: usize) -> Result<(u64, u64)> {
        if count == 0 {
            return Ok((0, 0));
        }
        let one = Self::f32_bytes(self.stored_len())?;
        let overflow = || crate::Error::Order("kept input bytes overflow".into());
        let times = |bytes: u64, n: usize| bytes.checked_mul(n as u64).ok_or_else(overflow);
        let host = match self.offload {
            true => times(one, count)?,
            false => 0,
        };
        if !self.partitioned() {
            return Ok((times(block_bytes(one)?, self.arena_blocks(count))?, host));
        }
        let whole = times(block_bytes(Self::f32_bytes(self.gathered_len())?)?, held)?;
        let slices = match self.offload {
            true => 0,
            false => times(block_bytes(one)?, count)?,
        };
        Ok((slices.checked_add(whole).ok_or_else(overflow)?, host))
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
            partitions: 1,
        };
        assert_eq!(arena.bytes(5, 1).unwrap(), (5 * 256, 0));
        let host = KeptInputs {
            offload: true,
            ..arena
        };
        assert_eq!(host.bytes(5, 1).unwrap(), (2 * 256, 5 * 256));
        assert_eq!(host.bytes(1, 1).unwrap(), (256, 256));
        assert_eq!(host.bytes(0, 0).unwrap(), (0, 0));
        let huge = KeptInputs {
            len: usize::MAX,
            offload: true,
            partitions: 1,
        };
        assert!(huge.bytes(1, 1).is_err());
    }

    #[test]
    fn partitioned_inputs_keep_a_padded_slice_each_and_one_whole_buffer_per_held_input() {
        // 130 f32 over 4 ranks: slices of 33 (132 bytes, one 256-byte block), 4 x 33 = 132
        // f32 in a whole buffer (528 bytes, three blocks of 256).
        let pa = KeptInputs {
            len: 130,
            offload: false,
            partitions: 4,
        };
        assert_eq!((pa.stored_len(), pa.gathered_len()), (33, 132));
        assert_eq!(pa.input_bytes().unwrap(), 132);
        assert_eq!(pa.bytes(5, 1).unwrap(), (5 * 256 + 768, 0));
        assert_eq!(pa.bytes(5, 2).unwrap(), (5 * 256 + 2 * 768, 0));
        let cpu = KeptInputs {
            offload: true,
            ..pa
        };
        assert_eq!(cpu.bytes(5, 1).unwrap(), (768, 5 * 132));
        // One partition is no partitioning.
        let whole = KeptInputs {
            partitions: 1,
            ..pa
        };
        assert_eq!((whole.stored_len(), whole.gathered_len()), (130, 130));
    }
}
