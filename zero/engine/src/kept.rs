//! The kept inputs of a rank (activation checkpointing's saved tensors, ZeRO-R's checkpoint
//! offload): where a program's `keeps` and `restores` ([`crate::Op`]) read and write, and
//! the copies between the arena and pinned host memory when they are offloaded.
//!
//! Without offload each kept input has an arena block of its own and no call moves a byte.
//! Offloaded, each has a pinned host buffer and the arena holds two staging slots
//! ([`STAGING_SLOTS`](crate::STAGING_SLOTS)); zero-alloc's [`CopyEngine`] runs the copies on
//! its own thread (on a CUDA arena, its copy stream), in the order they are queued. The
//! protocol, one step per derived call ([`Call`](crate::Call)):
//! 1. `BeginKeep(k)`: a free slot is handed to the operation (waiting, if both are busy, for
//!    the older copy to host to finish); the operation writes kept input `k` into it.
//! 2. `EndKeep(k)`: "slot -> host buffer k" is queued; the next operations run meanwhile.
//! 3. `Fetch(k)`: once host buffer k is back from its copy out (waited for if not), a free
//!    slot is taken and "host buffer k -> slot" is queued; the derivation places this one
//!    restore ahead, so it lands while earlier operations compute.
//! 4. `BeginRestore(k)`: the fetch is waited for and the slot handed to the operation.
//! 5. `EndRestore(k)`: the slot is free again.
//!
//! Soundness: a queued copy pins its slot, so the arena refuses to view, move or free it
//! until [`Transfer::wait`] unpins it, and the job owns the host buffer until then; the
//! engine hands an operation only a slot whose copy has been waited for. (The schedule's
//! check bounds what a pass holds, so two slots always suffice; see `KeptOrder`.) The slots
//! are allocated right after the model states, below every transient block, so a slot
//! pinned by a copy splits no free space when the arena compacts.
//!
//! Partitioned over the tensor-parallel group (P_a), the kept inputs are
//! [`crate::kept_partitioned`]'s, under the same calls.

use super::error::{Error, Result};
use super::kept_partitioned::{Gathered, Partitioned};
use super::planning::kept_plan::KeptInputs;
use zero_alloc::{Arena, CopyEngine, CopyTiming, Device, Handle, PinnedBuffer, Transfer};
use zero_comm::Communicator;

/// A rank's kept inputs: in arena blocks, or offloaded.
#[derive(Debug)]
pub(crate) enum KeptStore {
    /// One arena block per kept input (none when the programs keep nothing).
    Arena(Vec<Handle>),
    /// Pinned host buffers behind staging slots.
    Offloaded(Offloaded),
    /// Slices over the tensor-parallel group, gathered whole before they are read (P_a).
    Partitioned(Partitioned),
}

/// What a staging slot holds.
#[derive(Debug)]
enum Slot {
    Free,
    /// Handed to an operation writing kept input `k`.
    Writing(usize),
    /// Being copied to host buffer `k`.
    Out(usize, Transfer),
    /// Being filled from host buffer `k`.
    In(usize, Transfer),
    /// Filled from host buffer `k`, the copy waited for.
    Fetched(usize),
    /// Holding kept input `k`, handed to an operation reading it.
    Reading(usize),
}

/// Offloaded kept inputs: the copy thread, the slots and the host buffers (`None` while a
/// copy owns one).
#[derive(Debug)]
pub(crate) struct Offloaded {
    copier: CopyEngine,
    blocks: Vec<Handle>,
    slots: Vec<Slot>,
    hosts: Vec<Option<PinnedBuffer>>,
    bytes: usize,
    /// The arena's device, which the host buffers are page-locked for.
    device: Device,
    /// Copies waited for since the last [`KeptStore::take_landed`], with their kept input.
    landed: Vec<(usize, CopyTiming)>,
}

/// A host buffer of `bytes` for copies with an arena on `device`: page-locked through the
/// CUDA driver for a GPU's arena (so its copies are DMA), mlocked where the OS allows
/// otherwise.
pub(crate) fn host_buffer(device: Device, bytes: usize) -> Result<PinnedBuffer> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(ordinal) = device {
        return Ok(PinnedBuffer::cuda(ordinal, bytes)?);
    }
    let _ = device;
    Ok(PinnedBuffer::new(bytes)?)
}

impl KeptStore {
    /// The store of `count` kept inputs stored as `how`, by passes holding at most `held`
    /// at once ([`Schedule::kept_held`](crate::Schedule::kept_held)), its blocks from `arena`.
    pub fn new(arena: &mut Arena, count: usize, held: usize, how: KeptInputs) -> Result<Self> {
        if how.partitioned() {
            return Ok(Self::Partitioned(Partitioned::new(
                arena, count, held, how,
            )?));
        }
        let blocks = (0..how.arena_blocks(count))
            .map(|_| arena.alloc_elems::<f32>(how.len).map_err(Error::from))
            .collect::<Result<Vec<_>>>()?;
        if !how.offload || count == 0 {
            return Ok(Self::Arena(blocks));
        }
        let bytes = how.input_bytes()?;
        let device = arena.device();
        let hosts = (0..count)
            .map(|_| Ok(Some(host_buffer(device, bytes)?)))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self::Offloaded(Offloaded {
            copier: CopyEngine::new()?,
            slots: blocks.iter().map(|_| Slot::Free).collect(),
            blocks,
            hosts,
            bytes,
            device,
            landed: Vec::new(),
        }))
    }

    /// Makes kept-input call `call` (steps 1-5 of the module docs); `tp` is the engine's
    /// tensor-parallel group, which partitioned inputs are gathered over.
    pub fn call(
        &mut self,
        arena: &mut Arena,
        tp: Option<&Communicator>,
        call: crate::Call,
    ) -> Result<()> {
        let o = match self {
            Self::Arena(_) => return Ok(()),
            Self::Partitioned(p) => return p.call(arena, tp, call),
            Self::Offloaded(o) => o,
        };
        use crate::Call::{BeginKeep, BeginRestore, EndKeep, EndRestore, Fetch};
        match call {
            BeginKeep(k) => o.begin_keep(arena, k),
            EndKeep(k) => o.end_keep(arena, k),
            Fetch(k) => o.fetch(arena, k),
            BeginRestore(k) => o.begin_restore(arena, k),
            EndRestore(k) => o.end_restore(k),
            _ => Err(Error::Order(format!("{call} is not a kept-input call"))),
        }
    }

    /// The block holding kept input `k` for the running operation: written when `writing`,
    /// else read.
    pub fn block(&self, k: usize, writing: bool) -> Result<Handle> {
        let found = match self {
            Self::Arena(blocks) => blocks.get(k).copied(),
            Self::Offloaded(o) => o.slots.iter().zip(&o.blocks).find_map(|(s, &b)| {
                let held = match s {
                    Slot::Writing(j) if writing => Some(*j),
                    Slot::Reading(j) if !writing => Some(*j),
                    _ => None,
                };
                (held == Some(k)).then_some(b)
            }),
            Self::Partitioned(p) => p.block(k, writing),
        };
        found.ok_or_else(|| Error::Order(format!("kept input {k} is not handed out now")))
    }

    /// (arena, host) bytes the store holds: its blocks as the arena sized them, and the
    /// pinned host buffers.
    pub fn bytes(&self, arena: &Arena) -> Result<(u64, u64)> {
        let (blocks, host) = match self {
            Self::Partitioned(p) => return p.bytes(arena),
            Self::Arena(blocks) => (blocks, 0),
            Self::Offloaded(o) => (&o.blocks, (o.bytes * o.hosts.len()) as u64),
        };
        let mut on_arena = 0;
        for &b in blocks {
            on_arena += arena.block(b)?.size as u64;
        }
        Ok((on_arena, host))
    }

    /// The gathers of partitioned inputs waited for since the last call (for a timeline).
    pub fn take_gathered(&mut self) -> Vec<Gathered> {
        match self {
            Self::Partitioned(p) => p.take_gathered(),
            _ => Vec::new(),
        }
    }

    /// The copies waited for since the last call, with their kept input (for a timeline).
    pub fn take_landed(&mut self) -> Vec<(usize, CopyTiming)> {
        match self {
            Self::Arena(_) => Vec::new(),
            Self::Offloaded(o) => std::mem::take(&mut o.landed),
            Self::Partitioned(p) => p.take_landed(),
        }
    }

    /// Waits for every copy in flight and frees every slot, after a failed program; the
    /// first error is returned once everything is waited for.
    pub fn let_go(&mut self, arena: &mut Arena) -> Result<()> {
        let o = match self {
            Self::Arena(_) => return Ok(()),
            Self::Partitioned(p) => return p.let_go(arena),
            Self::Offloaded(o) => o,
        };
        let mut first = Ok(());
        for at in 0..o.slots.len() {
            if let Err(e) = o.settle(arena, at) {
                first = first.and(Err(e));
            }
            o.slots[at] = Slot::Free;
        }
        first
    }
}

impl Offloaded {
    /// Step 1.
    fn begin_keep(&mut self, arena: &mut Arena, k: usize) -> Result<()> {
        let at = self.free_slot(arena)?;
        self.slots[at] = Slot::Writing(k);
        Ok(())
    }

    /// Step 2.
    fn end_keep(&mut self, arena: &mut Arena, k: usize) -> Result<()> {
        let at = self.slot_of(|s| matches!(s, Slot::Writing(j) if *j == k), k)?;
        let host = self.take_host(k)?;
        let transfer = self
            .copier
            .to_host(arena, self.blocks[at], 0..self.bytes, host)?;
        self.slots[at] = Slot::Out(k, transfer);
        Ok(())
    }

    /// Step 3.
    fn fetch(&mut self, arena: &mut Arena, k: usize) -> Result<()> {
        if let Some(at) = self.find(|s| matches!(s, Slot::Out(j, _) if *j == k)) {
            self.settle(arena, at)?;
        }
        let at = self.free_slot(arena)?;
        let host = self.take_host(k)?;
        let transfer = self
            .copier
            .to_arena(arena, host, self.blocks[at], 0..self.bytes)?;
        self.slots[at] = Slot::In(k, transfer);
        Ok(())
    }

    /// Step 4.
    fn begin_restore(&mut self, arena: &mut Arena, k: usize) -> Result<()> {
        let at = self.slot_of(
            |s| matches!(s, Slot::In(j, _) | Slot::Fetched(j) if *j == k),
            k,
        )?;
        self.settle(arena, at)?;
        self.slots[at] = Slot::Reading(k);
        Ok(())
    }

    /// Step 5.
    fn end_restore(&mut self, k: usize) -> Result<()> {
        let at = self.slot_of(|s| matches!(s, Slot::Reading(j) if *j == k), k)?;
        self.slots[at] = Slot::Free;
        Ok(())
    }

    /// A free slot, waiting for the oldest copy to host when none is.
    fn free_slot(&mut self, arena: &mut Arena) -> Result<usize> {
        if let Some(at) = self.find(|s| matches!(s, Slot::Free)) {
            return Ok(at);
        }
        let at = self
            .find(|s| matches!(s, Slot::Out(..)))
            .ok_or_else(|| Error::Order("no staging slot is free for a kept input".into()))?;
        self.settle(arena, at)?;
        Ok(at)
    }

    /// Waits for slot `at`'s copy, if it has one, and takes its host buffer back; a copy
    /// to host leaves the slot free, a fetch leaves it in place for `begin_restore`.
    fn settle(&mut self, arena: &mut Arena, at: usize) -> Result<()> {
        let (k, transfer, fetched) = match std::mem::replace(&mut self.slots[at], Slot::Free) {
            Slot::Out(k, transfer) => (k, transfer, false),
            Slot::In(k, transfer) => (k, transfer, true),
            other => {
                self.slots[at] = other;
                return Ok(());
            }
        };
        let (host, timing) = transfer.wait_timed(arena)?;
        self.hosts[k] = Some(host);
        self.landed.push((k, timing));
        if fetched {
            self.slots[at] = Slot::Fetched(k);
        }
        Ok(())
    }

    /// Host buffer `k`, taken for a copy; a new one when a failed copy lost it.
    fn take_host(&mut self, k: usize) -> Result<PinnedBuffer> {
        let out = |s: &Slot| matches!(s, Slot::Out(j, _) | Slot::In(j, _) if *j == k);
        match self.hosts.get_mut(k) {
            Some(Some(_)) => Ok(self.hosts[k].take().expect("checked above")),
            Some(None) if !self.slots.iter().any(out) => host_buffer(self.device, self.bytes),
            _ => Err(Error::Order(format!(
                "host buffer of kept input {k} is missing or out on a copy"
            ))),
        }
    }

    fn find(&self, pred: impl Fn(&Slot) -> bool) -> Option<usize> {
        self.slots.iter().position(pred)
    }

    fn slot_of(&self, pred: impl Fn(&Slot) -> bool, k: usize) -> Result<usize> {
        self.find(pred)
            .ok_or_else(|| Error::Order(format!("kept input {k} is not where its call expects it")))
    }
}
