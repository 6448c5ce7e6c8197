//! The arena: one contiguous reservation carved into handle-named blocks.

use crate::config::{ArenaConfig, Backing};
use crate::error::{AllocError, Result};
use crate::free_list::FreeList;
use crate::handle::{next_arena_id, Block, Handle};
use crate::stats::Stats;
use crate::storage::Storage;
use crate::Device;

/// One live block as the arena records it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LiveBlock {
    pub(crate) offset: usize,
    pub(crate) len: usize,
    pub(crate) size: usize,
    pub(crate) pins: u32,
}

/// A slot is reused after a free with its generation bumped, so old handles go stale.
#[derive(Clone, Debug)]
struct Slot {
    generation: u32,
    block: Option<LiveBlock>,
}

#[derive(Clone, Debug, Default)]
struct Counters {
    allocated: usize,
    reserved: usize,
    peak: usize,
    live: usize,
    pinned: usize,
    allocs: u64,
    frees: u64,
    defrags: u64,
    bytes_moved: u64,
    ooms: u64,
}

/// What one [`Arena::defragment`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DefragReport {
    /// Blocks that changed offset.
    pub blocks_moved: usize,
    /// Bytes copied (the requested lengths of the moved blocks).
    pub bytes_moved: u64,
}

/// A contiguous reservation of one device, carved into blocks named by [`Handle`]s.
///
/// Placement is best-fit, frees coalesce, and [`defragment`](Self::defragment) compacts live
/// blocks toward the start. The arena is `Send` (one per rank thread) but not shared:
/// every mutation takes `&mut self`, and views borrow the arena, so the compiler rules out a
/// defragmentation while a view lives.
///
/// # Examples
///
/// ```
/// use zero_alloc::Arena;
///
/// let mut arena = Arena::host(1 << 20)?;
/// let h = arena.alloc_elems::<f32>(1024)?;
/// arena.slice_mut::<f32>(h)?.fill(1.5);
/// assert_eq!(arena.slice::<f32>(h)?[7], 1.5);
/// assert_eq!(arena.stats().allocated, 4096);
/// arena.free(h)?;
/// assert!(arena.free(h).is_err()); // double free is an error, not UB
/// # Ok::<(), zero_alloc::AllocError>(())
/// ```
pub struct Arena {
    id: u64,
    config: ArenaConfig,
    pub(crate) storage: Storage,
    slots: Vec<Slot>,
    free_slots: Vec<u32>,
    free: FreeList,
    counters: Counters,
}

// By hand: the block table can hold millions of entries; the statistics say what matters.
impl std::fmt::Debug for Arena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arena")
            .field("id", &self.id)
            .field("config", &self.config)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl Arena {
    /// Builds an arena from a configuration.
    ///
    /// # Errors
    ///
    /// [`AllocError::InvalidConfig`] for an alignment that is not a power of two,
    /// [`AllocError::Os`] when the reservation fails, [`AllocError::NotCompiledWithCuda`] or a
    /// CUDA error for a CUDA device that cannot be used.
    pub fn new(mut config: ArenaConfig) -> Result<Self> {
        if !config.alignment.is_power_of_two() {
            return Err(AllocError::InvalidConfig {
                reason: format!("alignment {} is not a power of two", config.alignment),
            });
        }
        config.capacity -= config.capacity % config.alignment;
        let storage = Storage::new(
            config.device,
            config.backing,
            config.capacity,
            config.alignment,
        )?;
        Ok(Self {
            id: next_arena_id(),
            free: FreeList::new(config.capacity),
            config,
            storage,
            slots: Vec::new(),
            free_slots: Vec::new(),
            counters: Counters::default(),
        })
    }

    /// A CPU arena of `capacity` bytes of (lazily committed) host memory.
    ///
    /// # Errors
    ///
    /// [`AllocError::Os`] when the address space cannot be reserved.
    pub fn host(capacity: usize) -> Result<Self> {
        Self::new(ArenaConfig::new(capacity))
    }

    /// An accounting-only CPU arena: exact placement and statistics, no memory.
    ///
    /// # Errors
    ///
    /// None in practice; the signature matches the other constructors.
    pub fn accounting(capacity: usize) -> Result<Self> {
        Self::new(ArenaConfig::new(capacity).backing(Backing::Accounting))
    }

    /// The arena's unique id (handles carry it).
    #[must_use]
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The configuration, with the capacity as rounded.
    #[must_use]
    pub fn config(&self) -> &ArenaConfig {
        &self.config
    }

    /// True when the arena's host memory is page-locked (a [`Backing::Pinned`] arena whose
    /// lock the OS granted).
    #[must_use]
    pub fn is_page_locked(&self) -> bool {
        matches!(&self.storage, Storage::Host(region) if region.is_locked())
    }

    /// The arena's device.
    #[must_use]
    pub fn device(&self) -> Device {
        self.config.device
    }

    /// Bytes a request of `bytes` occupies ([`ArenaConfig::block_size`]).
    fn rounded(&self, bytes: usize) -> Result<usize> {
        self.config
            .block_size(bytes)
            .ok_or(AllocError::SizeOverflow {
                count: bytes,
                elem_size: 1,
            })
    }

    /// Allocates `bytes` bytes (best fit). Fresh blocks are zeroed on first use of the
    /// reservation but hold stale bytes after reuse, like `malloc`.
    ///
    /// # Errors
    ///
    /// [`AllocError::OutOfMemory`] (carrying the statistics) when no hole fits, after a
    /// defragmentation if the configuration allows one and the total free space suffices.
    pub fn alloc(&mut self, bytes: usize) -> Result<Handle> {
        self.alloc_placed(bytes, FreeList::take_best_fit)
    }

    /// Allocates `bytes` bytes at the end of the highest hole that fits: for short-lived
    /// blocks that will be pinned (lent to an operation in flight), which then stack at the
    /// top of the arena and leave the space below them in one piece.
    ///
    /// # Errors
    ///
    /// As [`alloc`](Self::alloc).
    pub fn alloc_high(&mut self, bytes: usize) -> Result<Handle> {
        self.alloc_placed(bytes, FreeList::take_highest_fit)
    }

    fn alloc_placed(
        &mut self,
        bytes: usize,
        take: fn(&mut FreeList, usize) -> Option<usize>,
    ) -> Result<Handle> {
        let size = self.rounded(bytes)?;
        let mut found = take(&mut self.free, size);
        if found.is_none() && self.config.defragment_on_fragmentation && self.free.total() >= size {
            self.defragment()?;
            found = take(&mut self.free, size);
        }
        let Some(offset) = found else {
            self.counters.ooms += 1;
            return Err(AllocError::OutOfMemory {
                device: self.config.device,
                requested: bytes,
                rounded: size,
                stats: Box::new(self.stats()),
            });
        };
        self.place(offset, bytes, size)
    }

    /// Allocates room for `count` elements of `T`.
    ///
    /// # Errors
    ///
    /// [`AllocError::SizeOverflow`] when `count * size_of::<T>()` overflows; otherwise as
    /// [`alloc`](Self::alloc).
    pub fn alloc_elems<T: bytemuck::Pod>(&mut self, count: usize) -> Result<Handle> {
        self.alloc(elems_bytes::<T>(count)?)
    }

    /// Allocates room for `count` elements of `T` at the top ([`alloc_high`](Self::alloc_high)).
    ///
    /// # Errors
    ///
    /// As [`alloc_elems`](Self::alloc_elems).
    pub fn alloc_elems_high<T: bytemuck::Pod>(&mut self, count: usize) -> Result<Handle> {
        self.alloc_high(elems_bytes::<T>(count)?)
    }

    fn place(&mut self, offset: usize, len: usize, size: usize) -> Result<Handle> {
        let block = LiveBlock {
            offset,
            len,
            size,
            pins: 0,
        };
        let slot = if let Some(slot) = self.free_slots.pop() {
            self.slots[slot as usize].block = Some(block);
            slot
        } else {
            // u32 slots keep handles small; 4 billion live blocks is far past any real use.
            let Ok(slot) = u32::try_from(self.slots.len()) else {
                self.free.release(offset, size);
                return Err(AllocError::TooManyBlocks {
                    live: self.counters.live,
                });
            };
            self.slots.push(Slot {
                generation: 0,
                block: Some(block),
            });
            slot
        };
        let c = &mut self.counters;
        c.allocated += size;
        c.peak = c.peak.max(c.allocated);
        c.reserved = c.reserved.max(offset + size);
        c.live += 1;
        c.allocs += 1;
        Ok(Handle {
            arena: self.id,
            slot,
            generation: self.slots[slot as usize].generation,
        })
    }

    /// Frees a block; its space coalesces with free neighbours.
    ///
    /// # Errors
    ///
    /// [`AllocError::StaleHandle`] for a double free, [`AllocError::ForeignHandle`] for another
    /// arena's handle, [`AllocError::Pinned`] while an operation is in flight on the block.
    pub fn free(&mut self, handle: Handle) -> Result<()> {
        let block = *self.live(handle)?;
        if block.pins > 0 {
            return Err(AllocError::Pinned {
                handle,
                pins: block.pins,
                action: "freed",
            });
        }
        let slot = &mut self.slots[handle.slot as usize];
        slot.block = None;
        // Wrapping: a slot would need 2^32 reuses for a stale handle to match again.
        slot.generation = slot.generation.wrapping_add(1);
        self.free_slots.push(handle.slot);
        self.free.release(block.offset, block.size);
        let c = &mut self.counters;
        c.allocated -= block.size;
        c.live -= 1;
        c.frees += 1;
        Ok(())
    }

    /// Where a handle's block lies now.
    ///
    /// # Errors
    ///
    /// [`AllocError::StaleHandle`] or [`AllocError::ForeignHandle`].
    pub fn block(&self, handle: Handle) -> Result<Block> {
        let b = self.live(handle)?;
        Ok(Block {
            offset: b.offset,
            len: b.len,
            size: b.size,
        })
    }

    /// True while `handle` names a live block of this arena.
    #[must_use]
    pub fn contains(&self, handle: Handle) -> bool {
        self.live(handle).is_ok()
    }

    pub(crate) fn live(&self, handle: Handle) -> Result<&LiveBlock> {
        if handle.arena != self.id {
            return Err(AllocError::ForeignHandle {
                handle,
                handle_arena: handle.arena,
                arena: self.id,
            });
        }
        self.slots
            .get(handle.slot as usize)
            .filter(|slot| slot.generation == handle.generation)
            .and_then(|slot| slot.block.as_ref())
            .ok_or(AllocError::StaleHandle { handle })
    }

    fn live_mut(&mut self, handle: Handle) -> Result<&mut LiveBlock> {
        self.live(handle)?;
        // The check above proved the slot exists and holds the block.
        self.slots[handle.slot as usize]
            .block
            .as_mut()
            .ok_or(AllocError::StaleHandle { handle })
    }

    /// Pins a block for an in-flight operation: until a matching [`unpin`](Self::unpin) it is
    /// not moved by defragmentation, not freed, and not viewed. Pins nest.
    ///
    /// # Errors
    ///
    /// [`AllocError::StaleHandle`] or [`AllocError::ForeignHandle`].
    pub fn pin(&mut self, handle: Handle) -> Result<()> {
        let block = self.live_mut(handle)?;
        block.pins += 1;
        if block.pins == 1 {
            self.counters.pinned += 1;
        }
        Ok(())
    }

    /// Releases one pin.
    ///
    /// # Errors
    ///
    /// [`AllocError::NotPinned`] without a matching pin; stale or foreign handles as
    /// [`block`](Self::block).
    pub fn unpin(&mut self, handle: Handle) -> Result<()> {
        let block = self.live_mut(handle)?;
        if block.pins == 0 {
            return Err(AllocError::NotPinned { handle });
        }
        block.pins -= 1;
        if block.pins == 0 {
            self.counters.pinned -= 1;
        }
        Ok(())
    }

    /// Compacts live blocks toward the start in one ascending pass, preserving their bytes
    /// and updating their handles. Pinned blocks stay put; the hole before each one is filled
    /// with later blocks that fit (lowest offset first), and compaction resumes after it. With
    /// nothing pinned the free space ends as one hole at the end.
    ///
    /// Blocks are moved with memmove in ascending offset order: each destination lies below
    /// its source and above every block already placed, so one pass never overwrites live
    /// bytes; a block pulled into the hole before a pinned block moves down past it, into
    /// free space. (An optimal packing of those holes is a bin-packing search; the greedy
    /// fill is rejected as optimal but kept as cheap.)
    ///
    /// # Errors
    ///
    /// Only a device copy failure under `cuda`; host moves cannot fail.
    pub fn defragment(&mut self) -> Result<DefragReport> {
        let mut order: Vec<(usize, usize)> = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(i, slot)| slot.block.map(|b| (b.offset, i)))
            .collect();
        order.sort_unstable();
        let mut placed = vec![false; order.len()];
        let mut report = DefragReport::default();
        let mut cursor = 0;
        let mut holes = Vec::new();
        for k in 0..order.len() {
            if placed[k] {
                continue;
            }
            placed[k] = true;
            let Some(block) = self.slots[order[k].1].block else {
                continue;
            };
            if block.pins == 0 {
                self.relocate(order[k].1, cursor, &mut report)?;
                cursor += block.size;
                continue;
            }
            for j in k + 1..order.len() {
                let room = block.offset - cursor;
                let Some(later) = self.slots[order[j].1].block else {
                    continue;
                };
                if room == 0 {
                    break;
                }
                if !placed[j] && later.pins == 0 && later.size <= room {
                    self.relocate(order[j].1, cursor, &mut report)?;
                    cursor += later.size;
                    placed[j] = true;
                }
            }
            holes.push((cursor, block.offset - cursor));
            cursor = block.offset + block.size;
        }
        holes.push((cursor, self.config.capacity - cursor));
        self.storage.finish()?;
        self.free.rebuild(holes);
        self.counters.defrags += 1;
        self.counters.bytes_moved += report.bytes_moved;
        Ok(report)
    }

    /// Moves the block in `slot` down to `dst` (a no-op when it is already there).
    fn relocate(&mut self, slot: usize, dst: usize, report: &mut DefragReport) -> Result<()> {
        let Some(block) = self.slots[slot].block.as_mut() else {
            return Ok(());
        };
        if block.offset != dst {
            debug_assert!(dst < block.offset && block.pins == 0);
            self.storage.move_down(block.offset, dst, block.len)?;
            block.offset = dst;
            report.blocks_moved += 1;
            report.bytes_moved += block.len as u64;
        }
        Ok(())
    }

    /// Waits for the work queued on the arena's stream (CUDA arenas: its copies, and kernels
    /// launched on the same stream); returns at once on the host.
    ///
    /// # Errors
    ///
    /// A CUDA error from the wait.
    pub fn synchronize(&self) -> Result<()> {
        self.storage.finish()
    }

    /// Copies `src` to the start of a block, on any device with memory.
    ///
    /// # Errors
    ///
    /// [`AllocError::LengthMismatch`] when `src` is longer than the block,
    /// [`AllocError::Pinned`] during an in-flight operation, [`AllocError::NoHostMemory`] in
    /// accounting mode, stale or foreign handles, CUDA copy errors.
    pub fn write_bytes(&mut self, handle: Handle, src: &[u8]) -> Result<()> {
        self.write_at(handle, 0, src)
    }

    /// Copies `src` into a block from byte `offset` on, on any device with memory.
    ///
    /// # Errors
    ///
    /// As [`write_bytes`](Self::write_bytes), with `offset + src.len()` past the block.
    pub fn write_at(&mut self, handle: Handle, offset: usize, src: &[u8]) -> Result<()> {
        let block = self.unpinned(handle, "written")?;
        let end = offset.checked_add(src.len());
        if end.is_none_or(|end| end > block.len) {
            return Err(AllocError::LengthMismatch {
                src: offset.saturating_add(src.len()),
                dst: block.len,
            });
        }
        self.storage
            .write(self.config.device, block.offset + offset, src)
    }

    /// Copies the start of a block into `dst`, on any device with memory.
    ///
    /// # Errors
    ///
    /// As [`write_bytes`](Self::write_bytes), with `dst` longer than the block.
    pub fn read_bytes(&self, handle: Handle, dst: &mut [u8]) -> Result<()> {
        self.read_at(handle, 0, dst)
    }

    /// Copies a block's bytes from `offset` on into `dst`, on any device with memory.
    ///
    /// # Errors
    ///
    /// As [`write_bytes`](Self::write_bytes), with `offset + dst.len()` past the block.
    pub fn read_at(&self, handle: Handle, offset: usize, dst: &mut [u8]) -> Result<()> {
        let block = self.unpinned(handle, "read")?;
        let end = offset.checked_add(dst.len());
        if end.is_none_or(|end| end > block.len) {
            return Err(AllocError::LengthMismatch {
                src: block.len,
                dst: offset.saturating_add(dst.len()),
            });
        }
        self.storage
            .read(self.config.device, block.offset + offset, dst)
    }

    fn unpinned(&self, handle: Handle, action: &'static str) -> Result<LiveBlock> {
        let block = *self.live(handle)?;
        if block.pins > 0 {
            return Err(AllocError::Pinned {
                handle,
                pins: block.pins,
                action,
            });
        }
        Ok(block)
    }

    /// A snapshot of the statistics; O(1).
    #[must_use]
    pub fn stats(&self) -> Stats {
        let c = &self.counters;
        let largest_free = self.free.largest();
        let total_free = self.free.total();
        Stats {
            capacity: self.config.capacity,
            allocated: c.allocated,
            reserved: c.reserved,
            peak_allocated: c.peak,
            largest_free,
            total_free,
            fragmentation: Stats::fragmentation_of(largest_free, total_free),
            live_blocks: c.live,
            pinned_blocks: c.pinned,
            allocs: c.allocs,
            frees: c.frees,
            defrags: c.defrags,
            bytes_moved: c.bytes_moved,
            ooms: c.ooms,
        }
    }

    /// Resets the peak to the current allocation.
    pub fn reset_peak(&mut self) {
        self.counters.peak = self.counters.allocated;
    }

    /// Handles of every live block, in no particular order.
    #[must_use]
    pub fn handles(&self) -> Vec<Handle> {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, slot)| slot.block.is_some())
            .filter_map(|(i, slot)| {
                Some(Handle {
                    arena: self.id,
                    // `place` never creates a slot past u32::MAX.
                    slot: u32::try_from(i).ok()?,
                    generation: slot.generation,
                })
            })
            .collect()
    }

    /// The free holes as (offset, size), ascending.
    #[must_use]
    pub fn free_ranges(&self) -> Vec<(usize, usize)> {
        self.free.ranges().collect()
    }
}

/// Bytes of `count` elements of `T`.
fn elems_bytes<T>(count: usize) -> Result<usize> {
    let elem_size = std::mem::size_of::<T>();
    count
        .checked_mul(elem_size)
        .ok_or(AllocError::SizeOverflow { count, elem_size })
}
