//! The op-sequence interpreter and invariant checker shared by the property tests and the
//! `arena_ops` fuzz target, so both drive exactly the same rules.
//!
//! A [`Harness`] applies [`Op`]s to a real [`Arena`] and to a shadow model (a plain list of
//! live blocks with their offsets and bytes), then checks: no two live blocks overlap, every
//! block keeps its bytes (across defragmentation too), placement is best-fit, statistics equal
//! the model's, errors are the right ones, after a defragmentation with nothing pinned the
//! largest free block equals the total free space, and with pins no later block would have
//! fit a hole left before a pinned block. Not part of the stable API.

use crate::{AllocError, Arena, ArenaConfig, Backing, Handle};

/// One step of a random arena workload. `pick` indices are taken modulo the live (or dead)
/// block count; a step with nothing to pick is a no-op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Allocate this many bytes (best fit).
    Alloc(usize),
    /// Allocate this many bytes at the end of the highest hole that fits.
    AllocHigh(usize),
    /// Free a live block.
    Free(usize),
    /// Free an already freed handle (must be refused).
    FreeStale(usize),
    /// Overwrite a live block with a pattern from this seed.
    Write(usize, u8),
    /// Overwrite up to 7 bytes of a live block at an offset from this seed with the byte
    /// copies (`write_at`), then read the rest back (`read_at`).
    WriteAt(usize, u8),
    /// Compact.
    Defragment,
    /// Pin a live block.
    Pin(usize),
    /// Unpin a live block (refused when it is not pinned).
    Unpin(usize),
    /// Reset the peak statistic.
    ResetPeak,
}

/// Decodes fuzzer bytes into ops: a tag byte, then a little-endian u16 argument for ops
/// that take one. Alloc sizes reach past `capacity` so out-of-memory paths are exercised.
#[must_use]
pub fn ops_from_bytes(data: &[u8], capacity: usize) -> Vec<Op> {
    let mut ops = Vec::new();
    let mut rest = data;
    while let Some((&tag, tail)) = rest.split_first() {
        let (arg, tail) = match tail {
            [a, b, tail @ ..] => (usize::from(u16::from_le_bytes([*a, *b])), tail),
            _ => (0, &[][..]),
        };
        rest = tail;
        let bytes = arg * (capacity / 4 + 1) / 0x1_0000 + usize::from(tag >> 7) * capacity;
        ops.push(match tag % 10 {
            0 | 1 => Op::Alloc(bytes),
            2 => Op::AllocHigh(bytes),
            3 | 4 => Op::Free(arg),
            5 => Op::FreeStale(arg),
            6 if tag & 0x40 != 0 => Op::WriteAt(arg, tag),
            6 => Op::Write(arg, tag),
            7 => Op::Defragment,
            8 => {
                if tag & 0x80 == 0 {
                    Op::Pin(arg)
                } else {
                    Op::Unpin(arg)
                }
            }
            _ => Op::ResetPeak,
        });
    }
    ops
}

/// A live block as the model sees it.
#[derive(Clone, Debug)]
struct Shadow {
    handle: Handle,
    offset: usize,
    len: usize,
    size: usize,
    pins: u32,
    // None in accounting mode.
    bytes: Option<Vec<u8>>,
}

#[derive(Clone, Debug, Default)]
struct Expected {
    allocs: u64,
    frees: u64,
    ooms: u64,
    defrags: u64,
    bytes_moved: u64,
    peak: usize,
    reserved: usize,
}

/// A real arena and its shadow model, stepped together.
#[derive(Debug)]
pub struct Harness {
    arena: Arena,
    live: Vec<Shadow>,
    dead: Vec<Handle>,
    expect: Expected,
    has_memory: bool,
}

impl Harness {
    /// A harness over a fresh arena.
    ///
    /// # Errors
    ///
    /// When the arena cannot be built.
    pub fn new(
        capacity: usize,
        alignment: usize,
        backing: Backing,
        auto_defrag: bool,
    ) -> crate::Result<Self> {
        let config = ArenaConfig::new(capacity)
            .alignment(alignment)
            .backing(backing)
            .defragment_on_fragmentation(auto_defrag);
        Ok(Self {
            arena: Arena::new(config)?,
            live: Vec::new(),
            dead: Vec::new(),
            expect: Expected::default(),
            has_memory: backing != Backing::Accounting,
        })
    }

    /// The arena under test.
    #[must_use]
    pub fn arena(&self) -> &Arena {
        &self.arena
    }

    /// Applies every op, checking all invariants after each.
    ///
    /// # Errors
    ///
    /// A description of the first violated invariant.
    pub fn run(&mut self, ops: &[Op]) -> Result<(), String> {
        for (i, &op) in ops.iter().enumerate() {
            self.apply(op).map_err(|e| format!("op {i} {op:?}: {e}"))?;
            self.check()
                .map_err(|e| format!("after op {i} {op:?}: {e}"))?;
        }
        Ok(())
    }

    fn capacity(&self) -> usize {
        self.arena.config().capacity
    }

    fn rounded(&self, bytes: usize) -> Option<usize> {
        bytes
            .max(1)
            .checked_next_multiple_of(self.arena.config().alignment)
    }

    /// Free holes of the model, ascending by offset.
    fn model_holes(&self) -> Vec<(usize, usize)> {
        let mut blocks: Vec<(usize, usize)> =
            self.live.iter().map(|b| (b.offset, b.size)).collect();
        blocks.sort_unstable();
        let mut holes = Vec::new();
        let mut cursor = 0;
        for (offset, size) in blocks {
            if offset > cursor {
                holes.push((cursor, offset - cursor));
            }
            cursor = offset + size;
        }
        if self.capacity() > cursor {
            holes.push((cursor, self.capacity() - cursor));
        }
        holes
    }

    fn allocated(&self) -> usize {
        self.live.iter().map(|b| b.size).sum()
    }

    /// Applies one op to arena and model, checking the op's own outcome.
    ///
    /// # Errors
    ///
    /// A description of the violated rule.
    pub fn apply(&mut self, op: Op) -> Result<(), String> {
        // A pick among no blocks is a no-op.
        let among = |pick: usize, n: usize| pick.checked_rem(n);
        match op {
            Op::Alloc(bytes) => self.alloc(bytes, false),
            Op::AllocHigh(bytes) => self.alloc(bytes, true),
            Op::Free(pick) => among(pick, self.live.len()).map_or(Ok(()), |i| self.free(i)),
            Op::FreeStale(pick) => {
                among(pick, self.dead.len()).map_or(Ok(()), |i| self.free_stale(i))
            }
            Op::Write(pick, seed) => {
                among(pick, self.live.len()).map_or(Ok(()), |i| self.write(i, seed))
            }
            Op::WriteAt(pick, seed) => {
                among(pick, self.live.len()).map_or(Ok(()), |i| self.write_at(i, seed))
            }
            Op::Defragment => self.defragment(),
            Op::Pin(pick) => among(pick, self.live.len()).map_or(Ok(()), |i| self.pin(i)),
            Op::Unpin(pick) => among(pick, self.live.len()).map_or(Ok(()), |i| self.unpin(i)),
            Op::ResetPeak => {
                self.arena.reset_peak();
                self.expect.peak = self.allocated();
                Ok(())
            }
        }
    }

    fn free(&mut self, i: usize) -> Result<(), String> {
        let result = self.arena.free(self.live[i].handle);
        if self.live[i].pins > 0 {
            return expect_err(
                result,
                |e| matches!(e, AllocError::Pinned { .. }),
                "free of a pinned block",
            );
        }
        result.map_err(|e| format!("free failed: {e}"))?;
        let gone = self.live.swap_remove(i);
        self.dead.push(gone.handle);
        self.expect.frees += 1;
        Ok(())
    }

    fn free_stale(&mut self, i: usize) -> Result<(), String> {
        let result = self.arena.free(self.dead[i]);
        expect_err(
            result,
            |e| matches!(e, AllocError::StaleHandle { .. }),
            "double free",
        )
    }

    fn pin(&mut self, i: usize) -> Result<(), String> {
        self.arena
            .pin(self.live[i].handle)
            .map_err(|e| format!("pin failed: {e}"))?;
        self.live[i].pins += 1;
        Ok(())
    }

    fn unpin(&mut self, i: usize) -> Result<(), String> {
        let result = self.arena.unpin(self.live[i].handle);
        if self.live[i].pins == 0 {
            return expect_err(
                result,
                |e| matches!(e, AllocError::NotPinned { .. }),
                "unpin of unpinned block",
            );
        }
        result.map_err(|e| format!("unpin failed: {e}"))?;
        self.live[i].pins -= 1;
        Ok(())
    }

    /// Defragments, then checks the report, that no unpinned block could have moved into a
    /// hole before it, and that with nothing pinned the free space is one hole.
    fn defragment(&mut self) -> Result<(), String> {
        let report = self
            .arena
            .defragment()
            .map_err(|e| format!("defragment failed: {e}"))?;
        self.expect.defrags += 1;
        let moved = self.refresh_after_defrag()?;
        if moved != report.bytes_moved {
            return Err(format!(
                "report says {} bytes moved, blocks moved {moved}",
                report.bytes_moved
            ));
        }
        // Holes left before pinned blocks: every unpinned block past one is too big for it.
        for (hole_at, hole) in self.model_holes() {
            let fits = self
                .live
                .iter()
                .find(|b| b.pins == 0 && b.offset > hole_at && b.size <= hole);
            if let (Some(b), true) = (fits, hole_at + hole < self.capacity()) {
                return Err(format!(
                    "block {b:?} fits the hole ({hole_at}, {hole}) before it"
                ));
            }
        }
        let stats = self.arena.stats();
        if self.live.iter().all(|b| b.pins == 0) && stats.largest_free != stats.total_free {
            return Err(format!(
                "after defragment, largest free {} != total free {}",
                stats.largest_free, stats.total_free
            ));
        }
        Ok(())
    }

    /// The model's placement of `size` bytes: (offset, hole) by best fit, or at the end of
    /// the highest hole for `high`; `None` when no hole is large enough.
    fn predicted_place(&self, size: usize, high: bool) -> Option<(usize, usize)> {
        let fitting = self
            .model_holes()
            .into_iter()
            .filter(|&(_, hole)| hole >= size);
        if high {
            fitting
                .max_by_key(|&(offset, _)| offset)
                .map(|(offset, hole)| (offset + hole - size, hole))
        } else {
            fitting.min_by_key(|&(offset, hole)| (hole, offset))
        }
    }

    fn alloc(&mut self, bytes: usize, high: bool) -> Result<(), String> {
        let Some(size) = self.rounded(bytes) else {
            let result = self.arena.alloc(bytes);
            return expect_err(
                result,
                |e| matches!(e, AllocError::SizeOverflow { .. }),
                "overflowing size",
            );
        };
        let best = self.predicted_place(size, high);
        let total_free = self.capacity() - self.allocated();
        let defrags =
            best.is_none() && self.arena.config().defragment_on_fragmentation && total_free >= size;
        let result = if high {
            self.arena.alloc_high(bytes)
        } else {
            self.arena.alloc(bytes)
        };
        if defrags {
            self.expect.defrags += 1;
            self.refresh_after_defrag()?;
        }
        match result {
            Ok(handle) => self.allocated_as_predicted(handle, (bytes, size), best, defrags),
            Err(AllocError::OutOfMemory {
                requested,
                rounded,
                stats,
                ..
            }) => {
                if best.is_some() {
                    return Err(format!("out of memory although a hole of {size} exists"));
                }
                self.expect.ooms += 1;
                if (requested, rounded) != (bytes, size) {
                    return Err(format!(
                        "OOM reports request {requested}/{rounded}, asked {bytes}/{size}"
                    ));
                }
                if *stats != self.arena.stats() {
                    return Err("OOM statistics differ from the arena's".into());
                }
                if stats.largest_free >= size {
                    return Err(format!(
                        "OOM with a free hole of {} >= {size}",
                        stats.largest_free
                    ));
                }
                Ok(())
            }
            Err(e) => Err(format!("alloc({bytes}) failed with {e}")),
        }
    }

    /// Checks a fresh block against the prediction, records it in the model, and fills it.
    fn allocated_as_predicted(
        &mut self,
        handle: Handle,
        (bytes, size): (usize, usize),
        best: Option<(usize, usize)>,
        defragmented: bool,
    ) -> Result<(), String> {
        let block = self
            .arena
            .block(handle)
            .map_err(|e| format!("fresh handle unresolvable: {e}"))?;
        match best {
            Some((offset, _)) if block.offset != offset => {
                return Err(format!(
                    "placed at {} but the placement rule says {offset}",
                    block.offset
                ))
            }
            None if !defragmented => {
                return Err("allocation succeeded with no hole large enough".into())
            }
            _ => {}
        }
        if (block.len, block.size) != (bytes, size) {
            return Err(format!(
                "block {block:?} for a request of {bytes} ({size} rounded)"
            ));
        }
        self.live.push(Shadow {
            handle,
            offset: block.offset,
            len: bytes,
            size,
            pins: 0,
            bytes: self.has_memory.then(Vec::new),
        });
        self.expect.allocs += 1;
        self.expect.peak = self.expect.peak.max(self.allocated());
        self.expect.reserved = self.expect.reserved.max(block.offset + size);
        let seed = self.expect.allocs as u8;
        self.write(self.live.len() - 1, seed)
    }

    fn write(&mut self, i: usize, seed: u8) -> Result<(), String> {
        let shadow = &mut self.live[i];
        let Some(model) = shadow.bytes.as_mut() else {
            return expect_err(
                self.arena.slice_mut::<u8>(shadow.handle).map(|_| ()),
                |e| matches!(e, AllocError::NoHostMemory { .. }),
                "view of an accounting arena",
            );
        };
        let result = self.arena.slice_mut::<u8>(shadow.handle);
        if shadow.pins > 0 {
            return expect_err(
                result.map(|_| ()),
                |e| matches!(e, AllocError::Pinned { .. }),
                "view of a pinned block",
            );
        }
        let view = result.map_err(|e| format!("view failed: {e}"))?;
        for (j, x) in view.iter_mut().enumerate() {
            *x = seed.wrapping_mul(31).wrapping_add(j as u8);
        }
        model.clear();
        model.extend_from_slice(view);
        Ok(())
    }

    /// [`Op::WriteAt`] on live block `i`: the model takes the same bytes, and what the arena
    /// reads back from the offset on is the model's.
    fn write_at(&mut self, i: usize, seed: u8) -> Result<(), String> {
        let shadow = &mut self.live[i];
        let at = usize::from(seed) % (shadow.len + 1);
        let data: Vec<u8> = (0..(shadow.len - at).min(7))
            .map(|j| seed ^ (j as u8))
            .collect();
        let result = self.arena.write_at(shadow.handle, at, &data);
        // The arena refuses a pinned block before it looks at its memory.
        if shadow.pins > 0 {
            let want = |e: &AllocError| matches!(e, AllocError::Pinned { .. });
            return expect_err(result, want, "byte copy into a pinned block");
        }
        let Some(model) = shadow.bytes.as_mut() else {
            let want = |e: &AllocError| matches!(e, AllocError::NoHostMemory { .. });
            return expect_err(result, want, "byte copy into an accounting arena");
        };
        result.map_err(|e| format!("write_at failed: {e}"))?;
        model[at..at + data.len()].copy_from_slice(&data);
        let mut back = vec![0u8; shadow.len - at];
        self.arena
            .read_at(shadow.handle, at, &mut back)
            .map_err(|e| format!("read_at failed: {e}"))?;
        if back != model[at..] {
            return Err(format!("read_at from {at} differs from what was written"));
        }
        Ok(())
    }

    /// Reads new offsets after a defragmentation, checking how blocks may move; returns the
    /// bytes the model says were moved.
    fn refresh_after_defrag(&mut self) -> Result<u64, String> {
        let mut moved = 0;
        for b in &mut self.live {
            let now = self
                .arena
                .block(b.handle)
                .map_err(|e| format!("handle lost by defragment: {e}"))?
                .offset;
            if now != b.offset {
                if b.pins > 0 {
                    return Err(format!("pinned block moved from {} to {now}", b.offset));
                }
                if now > b.offset {
                    return Err(format!("block moved up from {} to {now}", b.offset));
                }
                moved += b.len as u64;
                b.offset = now;
            }
        }
        self.expect.bytes_moved += moved;
        Ok(moved)
    }

    /// Checks every invariant between arena and model.
    ///
    /// # Errors
    ///
    /// A description of the first violated invariant.
    pub fn check(&self) -> Result<(), String> {
        let align = self.arena.config().alignment;
        let mut spans = Vec::new();
        for b in &self.live {
            let block = self
                .arena
                .block(b.handle)
                .map_err(|e| format!("live handle unresolvable: {e}"))?;
            if (block.offset, block.len, block.size) != (b.offset, b.len, b.size) {
                return Err(format!("block {block:?} differs from model {b:?}"));
            }
            if block.offset % align != 0 || block.offset + block.size > self.capacity() {
                return Err(format!("block {block:?} misaligned or out of range"));
            }
            spans.push((block.offset, block.offset + block.size));
            if let (Some(model), 0) = (&b.bytes, b.pins) {
                let real = self
                    .arena
                    .slice::<u8>(b.handle)
                    .map_err(|e| format!("view failed: {e}"))?;
                if real != model.as_slice() {
                    return Err(format!("bytes of block at {} changed", b.offset));
                }
            }
        }
        spans.sort_unstable();
        if let Some(w) = spans.windows(2).find(|w| w[0].1 > w[1].0) {
            return Err(format!("blocks overlap: {:?} and {:?}", w[0], w[1]));
        }
        for &h in &self.dead {
            if self.arena.contains(h) {
                return Err(format!("freed handle {h:?} still resolves"));
            }
        }
        self.check_stats()
    }

    fn check_stats(&self) -> Result<(), String> {
        let s = self.arena.stats();
        let e = &self.expect;
        let allocated = self.allocated();
        let holes = self.model_holes();
        let largest = holes.iter().map(|h| h.1).max().unwrap_or(0);
        let pinned = self.live.iter().filter(|b| b.pins > 0).count();
        let want = crate::Stats {
            capacity: self.capacity(),
            allocated,
            reserved: e.reserved,
            peak_allocated: e.peak,
            largest_free: largest,
            total_free: self.capacity() - allocated,
            fragmentation: crate::Stats::fragmentation_of(largest, self.capacity() - allocated),
            live_blocks: self.live.len(),
            pinned_blocks: pinned,
            allocs: e.allocs,
            frees: e.frees,
            defrags: e.defrags,
            bytes_moved: e.bytes_moved,
            ooms: e.ooms,
        };
        if s != want {
            return Err(format!("stats {s:?}\n  model {want:?}"));
        }
        if self.arena.free_ranges() != holes {
            return Err(format!(
                "free ranges {:?}, model {holes:?}",
                self.arena.free_ranges()
            ));
        }
        Ok(())
    }
}

fn expect_err<T>(
    result: crate::Result<T>,
    ok: impl Fn(&AllocError) -> bool,
    what: &str,
) -> Result<(), String> {
    match result {
        Err(e) if ok(&e) => Ok(()),
        Err(e) => Err(format!("{what}: wrong error {e}")),
        Ok(_) => Err(format!("{what} was accepted")),
    }
}
