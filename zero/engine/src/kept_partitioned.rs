//! Kept inputs partitioned over the tensor-parallel group (ZeRO-R's P_a): each rank of the
//! group stores one slice of each kept input (chunk `tp_rank` of the input padded to P
//! slices, [`KeptInputs::stored_len`]), in an arena block or, offloaded (P_a + cpu), in a
//! pinned host buffer, and the whole input exists only in the whole-input buffers, one for
//! each kept input a pass holds at once ([`Schedule::kept_held`](crate::Schedule::kept_held)).
//! The protocol, one step per derived call ([`Call`](crate::Call)), as [`crate::kept`]'s:
//! 1. `BeginKeep(k)`: a free buffer is handed to the operation (waiting, offloaded, for the
//!    older slice's copy to host), which writes the whole input `k` into it.
//! 2. `EndKeep(k)`: this rank's chunk of the buffer goes home: copied into slice block `k`,
//!    or, offloaded, queued for host buffer `k` on the copy thread (the buffer is free once
//!    that copy lands).
//! 3. `Fetch(k)`: a free buffer is taken, the slice copied into its chunk (offloaded: from
//!    host buffer `k`, the copy waited for: a slice is 1/P of the input) and the in-place
//!    all-gather over the tensor-parallel group launched on a progress thread, the buffer
//!    lent to it. The derivation places this call one restore ahead, so the gather of the
//!    next restored input runs while the segment before it recomputes and runs backward.
//!    It runs on a duplicate of the group's communicator (split from it at the first
//!    fetch): a blocking call on a communicator first waits for what is queued on it, so on
//!    the group's own communicator the model's next sum would wait for the gather.
//! 4. `BeginRestore(k)`: the all-gather is waited for and the buffer handed to the operation.
//! 5. `EndRestore(k)`: the buffer is free again.
//!
//! Soundness: a lent buffer is pinned (the arena refuses to view, move or free it) until its
//! gather is waited for and taken back, and a buffer copying to host is pinned until its
//! [`Transfer`] is waited for; the store hands an operation only a buffer in neither state.

use super::error::{Error, Result};
use super::kept::host_buffer;
use super::planning::kept_plan::KeptInputs;
use std::ops::Range;
use std::time::Instant;
use zero_alloc::{Arena, CopyEngine, CopyTiming, Device, Handle, Lent, PinnedBuffer, Transfer};
use zero_comm::{Communicator, Work};

/// What a whole-input buffer holds.
#[derive(Debug)]
enum Buf {
    Free,
    /// Handed to an operation writing kept input `k`.
    Writing(usize),
    /// This rank's chunk being copied to host buffer `k`.
    Out(usize, Transfer),
    /// Lent to the all-gather of kept input `k`, launched at the instant.
    Gathering(usize, Work<Lent<f32>>, Instant),
    /// Holding kept input `k` whole, handed to an operation reading it.
    Reading(usize),
}

/// Where the slices rest.
#[derive(Debug)]
enum Home {
    /// One arena block per kept input.
    Arena(Vec<Handle>),
    /// Pinned host buffers.
    Host(HostSlices),
}

/// Slices in pinned host buffers (`None` while a copy owns one), the copy thread, and the
/// copies waited for since the last [`Partitioned::take_landed`].
#[derive(Debug)]
struct HostSlices {
    copier: CopyEngine,
    hosts: Vec<Option<PinnedBuffer>>,
    bytes: usize,
    device: Device,
    landed: Vec<(usize, CopyTiming)>,
}

impl HostSlices {
    /// Host buffer `k`, taken for a copy; a new one when a failed copy lost it (`out`:
    /// a copy still owns it).
    fn take(&mut self, k: usize, out: bool) -> Result<PinnedBuffer> {
        match self.hosts.get_mut(k) {
            Some(Some(_)) => Ok(self.hosts[k].take().expect("checked above")),
            Some(None) if !out => host_buffer(self.device, self.bytes),
            _ => Err(Error::Order(format!(
                "host slice of kept input {k} is missing or out on a copy"
            ))),
        }
    }
}

/// A rank's partitioned kept inputs.
#[derive(Debug)]
pub(crate) struct Partitioned {
    buffers: Vec<Handle>,
    states: Vec<Buf>,
    home: Home,
    /// f32 elements of one slice.
    slice: usize,
    /// Ranks of the tensor-parallel group the inputs are partitioned over.
    parts: usize,
    /// The communicator the gathers run on, split from the group's at the first fetch.
    gatherer: Option<Communicator>,
    /// Gathers waited for since the last [`Partitioned::take_gathered`].
    gathered: Vec<Gathered>,
}

/// An all-gather of a kept input's slices, from its launch until the store waited for it
/// and saw it land (an upper bound of its time on the wire), for a timeline.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Gathered {
    /// The kept input.
    pub k: usize,
    pub launched: Instant,
    pub landed: Instant,
    /// Bytes of the whole input it filled.
    pub bytes: u64,
}

impl Partitioned {
    /// The store of `count` kept inputs stored as `how` (partitioned), by passes holding
    /// at most `held` at once, its blocks from `arena`.
    pub fn new(arena: &mut Arena, count: usize, held: usize, how: KeptInputs) -> Result<Self> {
        let mut alloc = |n: usize, len: usize| -> Result<Vec<Handle>> {
            (0..n)
                .map(|_| arena.alloc_elems::<f32>(len).map_err(Error::from))
                .collect()
        };
        let buffers = alloc(if count == 0 { 0 } else { held }, how.gathered_len())?;
        let home = if how.offload {
            let device = arena.device();
            let hosts = (0..count)
                .map(|_| Ok(Some(host_buffer(device, how.input_bytes()?)?)))
                .collect::<Result<Vec<_>>>()?;
            Home::Host(HostSlices {
                copier: CopyEngine::new()?,
                hosts,
                bytes: how.input_bytes()?,
                device,
                landed: Vec::new(),
            })
        } else {
            Home::Arena(alloc(count, how.stored_len())?)
        };
        Ok(Self {
            states: buffers.iter().map(|_| Buf::Free).collect(),
            buffers,
            home,
            slice: how.stored_len(),
            parts: how.partitions,
            gatherer: None,
            gathered: Vec::new(),
        })
    }

    /// Makes kept-input call `call` (steps 1-5 of the module docs) with the tensor-parallel
    /// group `tp`.
    pub fn call(
        &mut self,
        arena: &mut Arena,
        tp: Option<&Communicator>,
        call: crate::Call,
    ) -> Result<()> {
        use crate::Call::{BeginKeep, BeginRestore, EndKeep, EndRestore, Fetch};
        match call {
            BeginKeep(k) => {
                let at = self.free_buffer(arena)?;
                self.states[at] = Buf::Writing(k);
                Ok(())
            }
            EndKeep(k) => self.end_keep(arena, self.group(tp)?, k),
            Fetch(k) => self.fetch(arena, self.group(tp)?, k),
            BeginRestore(k) => self.begin_restore(arena, k),
            EndRestore(k) => {
                let at = self.find_for(|s| matches!(s, Buf::Reading(j) if *j == k), k)?;
                self.states[at] = Buf::Free;
                Ok(())
            }
            _ => Err(Error::Order(format!("{call} is not a kept-input call"))),
        }
    }

    /// The tensor-parallel group, checked to have as many ranks as the partitions.
    fn group<'c>(&self, tp: Option<&'c Communicator>) -> Result<&'c Communicator> {
        match tp {
            Some(tp) if tp.size() == self.parts => Ok(tp),
            _ => Err(Error::Order(format!(
                "kept inputs are partitioned over {} ranks, but the engine's tensor-parallel \
                 group (Engine::with_tensor_parallel) has {}",
                self.parts,
                tp.map_or(1, Communicator::size)
            ))),
        }
    }

    /// The f32 elements of this rank's chunk in a whole-input buffer.
    fn chunk(&self, tp: &Communicator) -> Range<usize> {
        tp.rank() * self.slice..(tp.rank() + 1) * self.slice
    }

    /// Step 2.
    fn end_keep(&mut self, arena: &mut Arena, tp: &Communicator, k: usize) -> Result<()> {
        let at = self.find_for(|s| matches!(s, Buf::Writing(j) if *j == k), k)?;
        let (chunk, buffer) = (self.chunk(tp), self.buffers[at]);
        let out = self.out_on_copy(k);
        self.states[at] = match &mut self.home {
            Home::Arena(slices) => {
                let slice = *slices.get(k).ok_or_else(|| missing(k))?;
                copy_f32(arena, (buffer, chunk), (slice, 0..self.slice))?;
                Buf::Free
            }
            Home::Host(h) => {
                let host = h.take(k, out)?;
                let bytes = chunk.start * 4..chunk.end * 4;
                Buf::Out(k, h.copier.to_host(arena, buffer, bytes, host)?)
            }
        };
        Ok(())
    }

    /// Step 3.
    fn fetch(&mut self, arena: &mut Arena, tp: &Communicator, k: usize) -> Result<()> {
        if let Some(at) = self.find(|s| matches!(s, Buf::Out(j, _) if *j == k)) {
            self.settle(arena, at)?;
        }
        let at = self.free_buffer(arena)?;
        let (chunk, buffer) = (self.chunk(tp), self.buffers[at]);
        match &mut self.home {
            Home::Arena(slices) => {
                let slice = *slices.get(k).ok_or_else(|| missing(k))?;
                copy_f32(arena, (slice, 0..self.slice), (buffer, chunk))?;
            }
            Home::Host(h) => {
                let host = h.take(k, false)?;
                let bytes = chunk.start * 4..chunk.end * 4;
                let (host, timing) = h
                    .copier
                    .to_arena(arena, host, buffer, bytes)?
                    .wait_timed(arena)?;
                h.hosts[k] = Some(host);
                h.landed.push((k, timing));
            }
        }
        let gatherer = self.gatherer(tp)?;
        let work = gatherer.all_gather_async(arena.lend::<f32>(buffer)?);
        self.states[at] = Buf::Gathering(k, work, Instant::now());
        Ok(())
    }

    /// The gathers' communicator: a duplicate of `tp`, made by a collective on `tp` at the
    /// first fetch (every rank of the group runs the same program, so all make it there).
    fn gatherer(&mut self, tp: &Communicator) -> Result<&Communicator> {
        if self.gatherer.is_none() {
            let rank =
                u32::try_from(tp.rank()).map_err(|_| Error::Order("rank overflow".into()))?;
            self.gatherer = Some(tp.split(0, rank)?);
        }
        self.gatherer
            .as_ref()
            .ok_or_else(|| Error::Order("the gathers' communicator is missing".into()))
    }

    /// Step 4.
    fn begin_restore(&mut self, arena: &mut Arena, k: usize) -> Result<()> {
        let at = self.find_for(|s| matches!(s, Buf::Gathering(j, ..) if *j == k), k)?;
        self.settle(arena, at)?;
        self.states[at] = Buf::Reading(k);
        Ok(())
    }

    /// A free buffer, waiting for the oldest copy to host when none is.
    fn free_buffer(&mut self, arena: &mut Arena) -> Result<usize> {
        if let Some(at) = self.find(|s| matches!(s, Buf::Free)) {
            return Ok(at);
        }
        let at = self
            .find(|s| matches!(s, Buf::Out(..)))
            .ok_or_else(|| Error::Order("no whole-input buffer is free for a kept input".into()))?;
        self.settle(arena, at)?;
        Ok(at)
    }

    /// Waits for buffer `at`'s copy or gather, if it has one, and leaves it free (a copy
    /// to host, its host buffer taken back) or holding its gathered input (unpinned).
    fn settle(&mut self, arena: &mut Arena, at: usize) -> Result<()> {
        match std::mem::replace(&mut self.states[at], Buf::Free) {
            Buf::Out(k, transfer) => {
                let (host, timing) = transfer.wait_timed(arena)?;
                if let Home::Host(h) = &mut self.home {
                    h.hosts[k] = Some(host);
                    h.landed.push((k, timing));
                }
            }
            Buf::Gathering(k, work, launched) => {
                arena.take_back(work.wait()?)?;
                self.gathered.push(Gathered {
                    k,
                    launched,
                    landed: Instant::now(),
                    bytes: (self.slice * self.parts * 4) as u64,
                });
                self.states[at] = Buf::Reading(k);
            }
            other => self.states[at] = other,
        }
        Ok(())
    }

    /// A copy to host still owns host buffer `k`.
    fn out_on_copy(&self, k: usize) -> bool {
        self.states
            .iter()
            .any(|s| matches!(s, Buf::Out(j, _) if *j == k))
    }

    fn find(&self, pred: impl Fn(&Buf) -> bool) -> Option<usize> {
        self.states.iter().position(pred)
    }

    fn find_for(&self, pred: impl Fn(&Buf) -> bool, k: usize) -> Result<usize> {
        self.find(pred)
            .ok_or_else(|| Error::Order(format!("kept input {k} is not where its call expects it")))
    }

    /// The whole-input buffer holding kept input `k` for the running operation: written
    /// when `writing`, else read.
    pub fn block(&self, k: usize, writing: bool) -> Option<Handle> {
        self.states.iter().zip(&self.buffers).find_map(|(s, &b)| {
            let held = match s {
                Buf::Writing(j) if writing => Some(*j),
                Buf::Reading(j) if !writing => Some(*j),
                _ => None,
            };
            (held == Some(k)).then_some(b)
        })
    }

    /// (arena, host) bytes the store holds: its buffers and arena slices as the arena sized
    /// them, and the pinned host slices.
    pub fn bytes(&self, arena: &Arena) -> Result<(u64, u64)> {
        let (slices, host) = match &self.home {
            Home::Arena(slices) => (&slices[..], 0),
            Home::Host(h) => (&[][..], (h.bytes * h.hosts.len()) as u64),
        };
        let mut on_arena = 0;
        for &b in self.buffers.iter().chain(slices) {
            on_arena += arena.block(b)?.size as u64;
        }
        Ok((on_arena, host))
    }

    /// The gathers waited for since the last call.
    pub fn take_gathered(&mut self) -> Vec<Gathered> {
        std::mem::take(&mut self.gathered)
    }

    /// The copies to and from host waited for since the last call, with their kept input.
    pub fn take_landed(&mut self) -> Vec<(usize, CopyTiming)> {
        match &mut self.home {
            Home::Arena(_) => Vec::new(),
            Home::Host(h) => std::mem::take(&mut h.landed),
        }
    }

    /// Waits for every copy and gather in flight and frees every buffer, after a failed
    /// program; the first error is returned once everything is waited for.
    pub fn let_go(&mut self, arena: &mut Arena) -> Result<()> {
        let mut first = Ok(());
        for at in 0..self.states.len() {
            if let Err(e) = self.settle(arena, at) {
                first = first.and(Err(e));
            }
            self.states[at] = Buf::Free;
        }
        first
    }
}

/// No slice for kept input `k`: a call past the declared count.
fn missing(k: usize) -> Error {
    Error::Order(format!("kept input {k} has no slice"))
}

/// Copies the f32 `from` (a block and its element range) into `to`, on a host arena.
fn copy_f32(
    arena: &mut Arena,
    from: (Handle, Range<usize>),
    to: (Handle, Range<usize>),
) -> Result<()> {
    let mut views = arena.views();
    let src = views.get::<f32>(from.0)?;
    let dst = views.get_mut::<f32>(to.0)?;
    let (Some(src), Some(dst)) = (src.get(from.1), dst.get_mut(to.1)) else {
        return Err(Error::Order(
            "a kept slice's range lies outside its block".into(),
        ));
    };
    dst.copy_from_slice(src);
    Ok(())
}
