//! The optimizer's file tier over one step (`--offload-optimizer nvme`): every unit's owned
//! pieces, in update order, are read from the file into a slot of host arena blocks,
//! updated by the same host AdamW as without the file, and written back.
//!
//! The step's pieces form one sequence across its units ([`StepStream`]), and two slots
//! alternate along it: while the host updates piece i in one slot, the rank's I/O thread
//! (`optimizer_io`) writes piece i-1 back from the other slot and then reads piece i+1 into
//! it, whether i+1 is the same unit's next piece or the next unit's first; a unit's
//! all-gather after its update runs while the next unit's first piece is read. Jobs are
//! answered in the order sent, so the reply for piece i's read is the one after piece
//! i-1's. A step that fails part-way leaves its stream to be drained (its slots taken back
//! and freed) by whatever uses the file next: the next step, an export or an import.

use super::engine::Engine;
use super::error::{Error, Result};
use super::kernels::AdamWStep;
use super::optimizer_file::FileStates;
use super::optimizer_home::{
    update_piece, DeviceSide, OffloadedOptimizer, OptimSpans, Piece, Staging,
};
use super::optimizer_io::{Job, PieceId};
use super::precision::Store;
use super::trace::Trace;
use super::unit_buffers::UnitBuffers;
use zero_alloc::{Arena, Handle};

/// A step's pass over the file: the pieces every unit's update takes, in order, and the two
/// slots (each one block per state) they alternate in.
#[derive(Debug)]
pub(crate) struct StepStream {
    order: Vec<PieceId>,
    /// The next piece to update, an index into `order`.
    next: usize,
    /// Jobs sent and not yet answered.
    out: usize,
    slots: [Vec<Handle>; 2],
}

impl FileStates {
    /// Starts a step over the pieces `order`, in two slots of `slot_len` f32 per state:
    /// sends the reads of the first two. A stream a failed step left is drained first.
    pub fn begin_step(
        &mut self,
        arena: &mut Arena,
        order: Vec<PieceId>,
        slot_len: usize,
    ) -> Result<()> {
        self.end_step(arena, None)?;
        let slots = alloc_slots(arena, self.layout.states, slot_len)?;
        let first: Vec<PieceId> = order.iter().take(2).copied().collect();
        self.stream = Some(StepStream {
            order,
            next: 0,
            out: 0,
            slots,
        });
        for (slot, piece) in first.into_iter().enumerate() {
            self.send(arena, slot, None, Some(piece))?;
        }
        Ok(())
    }

    /// The slot holding `want`'s states once read (its blocks, one per state), which must
    /// be the stream's next piece.
    pub fn next_piece(
        &mut self,
        arena: &mut Arena,
        trace: Option<&mut Trace>,
        want: PieceId,
    ) -> Result<Vec<Handle>> {
        let Some(stream) = &self.stream else {
            return Err(outside());
        };
        if stream.order.get(stream.next) != Some(&want) {
            return Err(Error::Order(format!(
                "unit {} piece {} updated out of the step's order",
                want.0, want.1
            )));
        }
        let slot = stream.slots[stream.next % 2].clone();
        self.receive(arena, trace)?;
        Ok(slot)
    }

    /// The stream's next piece is updated: its slot writes it back, then reads the piece
    /// two ahead.
    pub fn piece_done(&mut self, arena: &mut Arena) -> Result<()> {
        let Some(stream) = &mut self.stream else {
            return Err(outside());
        };
        let i = stream.next;
        let (write, read) = (stream.order[i], stream.order.get(i + 2).copied());
        stream.next += 1;
        self.send(arena, i % 2, Some(write), read)
    }

    /// Ends the step's stream, if any: takes back every job still out and frees the slots;
    /// the first error.
    pub fn end_step(&mut self, arena: &mut Arena, mut trace: Option<&mut Trace>) -> Result<()> {
        let mut first = Ok(());
        while self.stream.as_ref().is_some_and(|s| s.out > 0) {
            first = first.and(self.receive(arena, trace.as_deref_mut()));
        }
        let Some(stream) = self.stream.take() else {
            return first;
        };
        let freed = stream
            .slots
            .iter()
            .flatten()
            .try_for_each(|&h| arena.free(h));
        first.and(freed.map_err(Error::from))
    }

    /// Lends slot `slot`'s blocks to the I/O thread with a job.
    fn send(
        &mut self,
        arena: &mut Arena,
        slot: usize,
        write: Option<PieceId>,
        read: Option<PieceId>,
    ) -> Result<()> {
        let Some(stream) = self.stream.as_mut() else {
            return Err(outside());
        };
        let mut bufs = Vec::with_capacity(stream.slots[slot].len());
        for &h in &stream.slots[slot] {
            match arena.lend::<u8>(h) {
                Ok(lent) => bufs.push(lent),
                Err(e) => {
                    for lent in bufs {
                        arena.take_back(lent)?;
                    }
                    return Err(e.into());
                }
            }
        }
        if let Err(unsent) = self.io.send(Job { write, read, bufs }) {
            // The job comes back unsent: its slot is taken back, not left lent.
            for lent in unsent.bufs {
                arena.take_back(lent)?;
            }
            return Err(gone());
        }
        stream.out += 1;
        Ok(())
    }

    /// Takes the next reply's blocks back into `arena`, counting what moved and recording
    /// its spans; its I/O error, if any.
    fn receive(&mut self, arena: &mut Arena, trace: Option<&mut Trace>) -> Result<()> {
        let Some(stream) = self.stream.as_mut() else {
            return Err(outside());
        };
        let Some(reply) = self.io.receive() else {
            // A thread gone (it panicked) answers nothing more: its slots stay lent, and
            // freeing them fails, which the step reports after this error.
            stream.out = 0;
            return Err(gone());
        };
        stream.out -= 1;
        self.read_bytes += reply.moved.0;
        self.written_bytes += reply.moved.1;
        for span in &reply.spans {
            let seconds = span.end.duration_since(span.start).as_secs_f64();
            match span.name.starts_with("read") {
                true => self.io_seconds.0 += seconds,
                false => self.io_seconds.1 += seconds,
            }
        }
        if let Some(trace) = trace {
            trace.spans.extend(reply.spans);
        }
        for lent in reply.bufs {
            arena.take_back(lent)?;
        }
        Ok(reply.result?)
    }
}

/// Refuses `unit`'s owned range starting at element `optim_at` of its kept optimizer block
/// anywhere but 0: the file holds the kept range's pieces from its first element, and the
/// stream moves them whole (a stage keeps the states of exactly the range a rank owns).
pub(crate) fn starts_at_a_piece(unit: usize, optim_at: usize) -> Result<()> {
    match optim_at {
        0 => Ok(()),
        at => Err(Error::Order(format!(
            "unit {unit}'s owned range at element {at} of its kept block: the file's pieces \
             start at 0"
        ))),
    }
}

fn gone() -> Error {
    Error::Order("the optimizer file's I/O thread is gone".into())
}

fn outside() -> Error {
    Error::Order("a piece of the optimizer file outside a step".into())
}

/// Two slots of `states` blocks of `len` f32, or none (what was allocated is freed).
fn alloc_slots(arena: &mut Arena, states: usize, len: usize) -> Result<[Vec<Handle>; 2]> {
    let mut blocks = Vec::with_capacity(2 * states);
    for _ in 0..2 * states {
        match arena.alloc_elems::<f32>(len) {
            Ok(h) => blocks.push(h),
            Err(e) => {
                for h in blocks {
                    arena.free(h)?;
                }
                return Err(e.into());
            }
        }
    }
    let second = blocks.split_off(states);
    Ok([blocks, second])
}

/// `unit`'s update from and back to `host`'s file, along the step's stream: the `owned`
/// elements from `first`, a piece at a time.
pub(crate) fn update_from_file<S: Store>(
    device: &mut DeviceSide<'_>,
    host: &mut OffloadedOptimizer,
    (unit, b): (usize, &UnitBuffers),
    (first, owned): (Piece, usize),
    step: &AdamWStep<'_>,
    mut trace: Option<&mut Trace>,
) -> Result<()> {
    let OffloadedOptimizer {
        arena,
        kernels,
        file,
        ..
    } = host;
    let file = file
        .as_mut()
        .ok_or_else(|| Error::Order("no optimizer file".into()))?;
    starts_at_a_piece(unit, first.optim)?;
    let piece = file.layout.piece;
    let stage = Staging::new(arena, S::DTYPE, owned.min(piece), device.grads_on_host)?;
    let mut updated = Ok(());
    for k in 0..owned.div_ceil(piece) {
        let start = k * piece;
        let at = first.advanced(start, piece.min(owned - start));
        let step = AdamWStep {
            offset: step.offset + start,
            ..*step
        };
        updated = file
            .next_piece(arena, trace.as_deref_mut(), (unit, k))
            .and_then(|slot| {
                let optim = OptimSpans::of_slot(&slot, at.len);
                update_piece::<S>(device, (arena, kernels), &stage, b, at, optim, &step)
            })
            .and_then(|()| file.piece_done(arena));
        if updated.is_err() {
            break;
        }
    }
    // The update's own failure explains more than a failure to free after it.
    updated.and(stage.free(arena))
}

impl Engine {
    /// Starts the step's stream over the optimizer file (nothing without the file tier):
    /// every unit's owned pieces in update order, in slots as large as the largest piece of
    /// any unit's kept range.
    pub(crate) fn begin_file_step(&mut self) -> Result<()> {
        let Some((order, slot_len)) = self.file_step_order() else {
            return Ok(());
        };
        match &mut self.offloaded {
            Some(OffloadedOptimizer {
                file: Some(file),
                arena,
                ..
            }) => file.begin_step(arena, order, slot_len),
            _ => Ok(()),
        }
    }

    /// With the optimizer's file tier: the pieces a step updates, every unit's owned pieces
    /// in unit order, and the f32 length of a slot (the largest piece of any rank's kept
    /// range); `None` without the file.
    pub(crate) fn file_step_order(&self) -> Option<(Vec<PieceId>, usize)> {
        let piece = self.offloaded.as_ref()?.file.as_ref()?.layout.piece;
        let rank = self.rank();
        let (mut order, mut slot_len) = (Vec::new(), 1);
        for (unit, p) in self.units.policies.iter().enumerate() {
            slot_len = slot_len.max(p.len(p.whole_optim).min(piece));
            order.extend((0..p.owned(rank).len.div_ceil(piece)).map(|k| (unit, k)));
        }
        Some((order, slot_len))
    }

    /// Ends the step's stream over the optimizer file, if any (`FileStates::end_step`).
    pub(crate) fn end_file_step(&mut self) -> Result<()> {
        let Some(OffloadedOptimizer {
            file: Some(file),
            arena,
            ..
        }) = &mut self.offloaded
        else {
            return Ok(());
        };
        file.end_step(arena, self.trace.as_mut())
    }
}
