//! How an arena is built.

use crate::Device;

/// The default block alignment: 256 bytes, what CUDA's allocator guarantees, so a block can
/// feed any vectorised kernel on either device.
pub const DEFAULT_ALIGNMENT: usize = 256;

/// What stands behind an arena's address range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Backing {
    /// Real memory: pageable host memory on [`Device::Cpu`], device memory on
    /// [`Device::Cuda`].
    #[default]
    Memory,
    /// Page-locked host memory (CPU only). Falls back to pageable memory, with a logged
    /// warning, when the OS refuses to lock.
    Pinned,
    /// Host memory (CPU only) registered with GPU `ordinal`'s CUDA context
    /// (`cuMemHostRegister`), which page-locks it and lets the driver copy between it and
    /// device memory by DMA. Falls back to [`Backing::Pinned`], with a logged warning,
    /// without feature `cuda` or when the driver refuses.
    CudaRegistered(usize),
    /// No memory at all: sizes and offsets are tracked exactly, views are refused. For
    /// planning footprints far beyond this machine.
    Accounting,
}

/// Parameters of an [`Arena`](crate::Arena).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArenaConfig {
    /// Device whose memory the arena carves.
    pub device: Device,
    /// The capacity cap in bytes (rounded down to `alignment`).
    pub capacity: usize,
    /// Alignment of every block's offset and size; a power of two.
    pub alignment: usize,
    /// Real, pinned, or no memory.
    pub backing: Backing,
    /// When an allocation finds no hole large enough although the total free space would
    /// do, defragment and retry instead of failing.
    pub defragment_on_fragmentation: bool,
}

impl ArenaConfig {
    /// A CPU arena of `capacity` bytes with host memory, 256-byte alignment and automatic
    /// defragmentation.
    #[must_use]
    pub fn new(capacity: usize) -> Self {
        Self {
            device: Device::Cpu,
            capacity,
            alignment: DEFAULT_ALIGNMENT,
            backing: Backing::Memory,
            defragment_on_fragmentation: true,
        }
    }

    /// Sets the device.
    #[must_use]
    pub fn device(mut self, device: Device) -> Self {
        self.device = device;
        self
    }

    /// Sets the alignment.
    #[must_use]
    pub fn alignment(mut self, alignment: usize) -> Self {
        self.alignment = alignment;
        self
    }

    /// Sets the backing.
    #[must_use]
    pub fn backing(mut self, backing: Backing) -> Self {
        self.backing = backing;
        self
    }

    /// Bytes a request of `bytes` occupies in such an arena: rounded up to the alignment, at
    /// least one unit so every live block has a distinct offset (`None` on overflow). What
    /// the arena's statistics count for the block.
    #[must_use]
    pub fn block_size(&self, bytes: usize) -> Option<usize> {
        bytes.max(1).checked_next_multiple_of(self.alignment)
    }

    /// Turns automatic defragmentation on allocation failure on or off.
    #[must_use]
    pub fn defragment_on_fragmentation(mut self, on: bool) -> Self {
        self.defragment_on_fragmentation = on;
        self
    }
}
