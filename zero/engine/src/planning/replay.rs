//! A model of one step's transient memory: the declared schedule replayed against the
//! engine's allocation rules, counting bytes, with no memory and no communication.
//!
//! The rules, as the engine applies them (every block rounded as the arena rounds it):
//! 1. `gather` of a unit the model cannot read in place makes a whole f32 compute copy: from
//!    its prefetched all-gather (f32 storage: the staged block becomes the copy; half
//!    precision: a copy is made, then the staged block freed), or directly (stage 3 in half
//!    precision stages the all-gather in the storage type beside the new copy). A gather that
//!    made a copy launches the all-gathers of the next `prefetch_units` distinct units the
//!    schedule gathers, each staged in the storage type, skipping those not sharded, already
//!    gathered or already in flight. Nested gathers share the copy.
//! 2. `release` frees the copy when its last user releases it.
//! 3. `begin_backward` opens a whole f32 gradient.
//! 4. `end_backward` stages the gradient bucket by bucket (zero-comm's `ShardBuckets`), each
//!    bucket launched and then the oldest completed (freed) while more than
//!    [`MAX_IN_FLIGHT`] are in flight; then the f32 gradient is freed.
//! 5. The end of a micro-step completes every reduction in flight.
//! 6. The optimizer step makes one f32 copy of the gradient range a rank updates per unit,
//!    one unit at a time.
//!
//! Completion never depends on timing (rule 4 completes by count), so the peak is the same
//! on every run and equals what the arena measures on the rank with the widest updated range
//! (a last rank whose shard holds fewer real elements can peak lower in rule 6).

use super::plan::{block_bytes, PlanShape};
use super::policy::UnitPolicy;
use super::schedule::upcoming_gathers;
use super::schedule::Call;
use crate::error::Result;
use std::collections::VecDeque;
use zero_comm::ShardBuckets;

/// Gradient buckets allowed in flight before a reduction waits for the oldest. Two keep
/// the communicator busy behind the backward without letting staged buckets pile up; the
/// memory plan reserves room for them.
pub const MAX_IN_FLIGHT: usize = 2;

/// Replay state: live transient bytes, their peak, and each unit's transient blocks.
pub(crate) struct Replay<'a> {
    policies: &'a [UnitPolicy],
    shape: PlanShape,
    live: u64,
    peak: u64,
    copies: Vec<Option<u64>>,
    users: Vec<usize>,
    prefetched: Vec<Option<u64>>,
    unreduced: Vec<Option<u64>>,
    in_flight: VecDeque<u64>,
}

impl<'a> Replay<'a> {
    pub fn new(policies: &'a [UnitPolicy], shape: PlanShape) -> Self {
        let n = policies.len();
        Self {
            policies,
            shape,
            live: 0,
            peak: 0,
            copies: vec![None; n],
            users: vec![0; n],
            prefetched: vec![None; n],
            unreduced: vec![None; n],
            in_flight: VecDeque::new(),
        }
    }

    /// The peak of transient bytes over one micro-step of `calls` and the optimizer step.
    pub fn peak_of_step(mut self, calls: &[Call]) -> Result<u64> {
        for (at, &call) in calls.iter().enumerate() {
            match call {
                Call::Gather(u) => self.gather(calls, at, u)?,
                Call::Release(u) => self.release(u),
                Call::BeginBackward(u) => {
                    let bytes = self.f32_unit(u)?;
                    self.alloc(bytes);
                    self.unreduced[u] = Some(bytes);
                }
                Call::EndBackward(u) => self.end_backward(u)?,
                // Kept inputs live in blocks allocated at start-up ([`super::plan`]).
                _ => {}
            }
        }
        while let Some(bucket) = self.in_flight.pop_front() {
            self.free(bucket);
        }
        self.optimizer_step()?;
        Ok(self.peak)
    }

    fn alloc(&mut self, bytes: u64) {
        self.live += bytes;
        self.peak = self.peak.max(self.live);
    }

    fn free(&mut self, bytes: u64) {
        self.live -= bytes;
    }

    /// Block bytes of `elems` elements of `size` bytes.
    fn block(elems: usize, size: usize) -> Result<u64> {
        block_bytes(elems as u64 * size as u64)
    }

    fn f32_unit(&self, u: usize) -> Result<u64> {
        Self::block(self.policies[u].part.padded_numel(), 4)
    }

    fn stored_unit(&self, u: usize) -> Result<u64> {
        let elem = self.shape.precision.param_bytes() as usize;
        Self::block(self.policies[u].part.padded_numel(), elem)
    }

    fn gather(&mut self, calls: &[Call], at: usize, u: usize) -> Result<()> {
        let p = self.policies[u];
        if p.reads_stored {
            return Ok(());
        }
        self.users[u] += 1;
        if self.copies[u].is_some() {
            return Ok(());
        }
        let copy = self.f32_unit(u)?;
        let staged_type_is_f32 = self.shape.precision.param_bytes() == 4;
        match self.prefetched[u].take() {
            Some(_) if staged_type_is_f32 => {}
            Some(staged) => {
                self.alloc(copy);
                self.free(staged);
            }
            None => {
                self.alloc(copy);
                if p.gathered() && !staged_type_is_f32 {
                    let staged = self.stored_unit(u)?;
                    self.alloc(staged);
                    self.free(staged);
                }
            }
        }
        self.copies[u] = Some(copy);
        for next in upcoming_gathers(calls, at + 1, self.shape.prefetch_units) {
            let q = self.policies[next];
            if q.gathered() && self.copies[next].is_none() && self.prefetched[next].is_none() {
                let staged = self.stored_unit(next)?;
                self.alloc(staged);
                self.prefetched[next] = Some(staged);
            }
        }
        Ok(())
    }

    fn release(&mut self, u: usize) {
        if self.policies[u].reads_stored {
            return;
        }
        self.users[u] -= 1;
        if self.users[u] == 0 {
            if let Some(copy) = self.copies[u].take() {
                self.free(copy);
            }
        }
    }

    fn end_backward(&mut self, u: usize) -> Result<()> {
        let part = self.policies[u].part;
        let elem = self.shape.precision.param_bytes() as usize;
        let layout = ShardBuckets::new(
            part.world(),
            part.shard_len(),
            self.shape.reduce_bucket_bytes / elem,
        )?;
        for bucket in layout.buckets() {
            let staged = Self::block(layout.bucket_elems(bucket), elem)?;
            self.alloc(staged);
            self.in_flight.push_back(staged);
            while self.in_flight.len() > MAX_IN_FLIGHT {
                if let Some(done) = self.in_flight.pop_front() {
                    self.free(done);
                }
            }
        }
        if let Some(grad) = self.unreduced[u].take() {
            self.free(grad);
        }
        Ok(())
    }

    /// The step's f32 gradient copy of each unit's updated range, the largest any rank makes.
    fn optimizer_step(&mut self) -> Result<()> {
        if self.shape.offload_optimizer {
            return Ok(());
        }
        for p in self.policies {
            let widest = (0..self.shape.world)
                .map(|r| p.owned(r).len.max(1))
                .max()
                .unwrap_or(1);
            let grad32 = Self::block(widest, 4)?;
            self.alloc(grad32);
            self.free(grad32);
        }
        Ok(())
    }
}
