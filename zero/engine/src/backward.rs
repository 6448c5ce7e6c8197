//! Backward: a unit's unreduced f32 gradient buffer, its reduction across ranks in buckets
//! launched as soon as the unit's backward ends, and the accumulation of the part this rank
//! keeps.

use super::collectives::InPlace;
use super::engine::{Engine, UnitViews};
use super::error::{Error, Result};
use super::inflight::{InFlight, MAX_IN_FLIGHT};
use super::kernels::Span;
use super::planning::policy::GradReduce;
use super::precision::{with_store, Store};
use super::trace::Launched;
use super::transient::{free_after, free_on_error};
use zero_alloc::Handle;
use zero_comm::{Bucket, DType, ShardBuckets};

impl Engine {
    /// Starts `unit`'s backward: gives it a zeroed f32 buffer for its unreduced gradient.
    ///
    /// # Errors
    /// Unknown unit, a backward already begun, arena failures.
    pub(crate) fn begin_backward(&mut self, unit: usize) -> Result<()> {
        self.check_unit(unit)?;
        if self.units.bufs[unit].unreduced.is_some() {
            return Err(Error::Order(format!(
                "begin_backward of unit {unit} twice without end_backward"
            )));
        }
        let padded = self.units.policies[unit].part.padded_numel();
        let h = self.alloc_transient::<f32>(padded)?;
        let zeroed = self
            .kernels
            .fill_zero(&mut self.arena, DType::F32, Span::new(h, 0..padded));
        free_on_error(&mut self.arena, h, zeroed)?;
        self.units.bufs[unit].unreduced = Some(h);
        Ok(())
    }

    /// Parameters of `param_units` and unreduced gradients of `grad_units`, all at once, for
    /// a model's backward call (e.g. the tied LM head reads two units and writes two).
    ///
    /// # Errors
    /// A unit not gathered or not in backward, a gradient unit listed twice, an arena without
    /// host memory (`OpUnits::device_views` views a CUDA arena).
    pub(crate) fn views(
        &mut self,
        param_units: &[usize],
        grad_units: &[usize],
    ) -> Result<UnitViews<'_>> {
        let (params, grads) = self.unit_spans(param_units, grad_units)?;
        let mut views = self.arena.views();
        let mut p = Vec::with_capacity(params.len());
        for s in params {
            p.push(&views.get::<f32>(s.block)?[s.range()]);
        }
        let mut g = Vec::with_capacity(grads.len());
        for s in grads {
            g.push(&mut views.get_mut::<f32>(s.block)?[s.range()]);
        }
        Ok((p, g))
    }

    /// Where [`Engine::views`] (and `OpUnits::device_views` on a CUDA arena) point, as spans
    /// of [`Engine::arena`]'s blocks (f32, the units' `numel` elements). Valid until the next
    /// call into the engine, which may move blocks; a gradient span is written only between
    /// its unit's `begin_backward` and `end_backward`.
    ///
    /// # Errors
    /// A unit not gathered or not in backward.
    pub(crate) fn unit_spans(
        &self,
        param_units: &[usize],
        grad_units: &[usize],
    ) -> Result<(Vec<Span>, Vec<Span>)> {
        let params = param_units
            .iter()
            .map(|&u| {
                Ok(Span::new(
                    self.param_block(u)?,
                    0..self.units.specs[u].numel,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        let grads = grad_units
            .iter()
            .map(|&u| {
                self.check_unit(u)?;
                let h = self.units.bufs[u].unreduced.ok_or_else(|| {
                    Error::Order(format!("gradients of unit {u} used outside its backward"))
                })?;
                Ok(Span::new(h, 0..self.units.specs[u].numel))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok((params, grads))
    }

    /// Ends `unit`'s backward: rounds its gradient to the storage type (scaled by fp16's loss
    /// scale) into buckets and launches their reduction across ranks (average) on the
    /// communicator's progress thread, so it overlaps the backward of the units before it. The reduced part
    /// this rank keeps is accumulated when the reduction completes: by a later call once it
    /// is done, when more than [`MAX_IN_FLIGHT`] are pending, or at [`Engine::step`].
    ///
    /// # Errors
    /// A unit not in backward, a divergent unit order, collective or arena failures (of this
    /// reduction or of an earlier one completed here).
    pub(crate) fn end_backward(&mut self, unit: usize) -> Result<()> {
        self.check_unit(unit)?;
        let tmp = self.units.bufs[unit].unreduced.take().ok_or_else(|| {
            Error::Order(format!(
                "end_backward of unit {unit} without begin_backward"
            ))
        })?;
        with_store!(self.config.precision, S => self.launch_reduce::<S>(unit, tmp))
    }

    /// Launches the reduction of `unit`'s gradient `tmp` (f32, the model's buffer) in
    /// buckets of at most `reduce_bucket_bytes`, then frees `tmp`.
    ///
    /// The buckets are zero-comm's [`ShardBuckets`] layout (bucket k holds the k-th piece of
    /// every rank's shard), staged in arena blocks lent to the collective: shards stay
    /// contiguous whatever the bucket size, the staging memory is a few buckets whatever the
    /// unit size, and each element is still summed in rank order, so the bucket size never
    /// changes a bit of the result.
    fn launch_reduce<S: Store>(&mut self, unit: usize, tmp: Handle) -> Result<()> {
        let result = self.launch_buckets::<S>(unit, tmp);
        free_after(&mut self.arena, tmp, result)
    }

    fn launch_buckets<S: Store>(&mut self, unit: usize, tmp: Handle) -> Result<()> {
        let part = self.units.policies[unit].part;
        let bucket_elems = self.config.reduce_bucket_bytes / std::mem::size_of::<S>();
        let layout = ShardBuckets::new(part.world(), part.shard_len(), bucket_elems)?;
        let scale = self.progress.scaler.scale;
        for bucket in layout.buckets() {
            let elems = layout.bucket_elems(bucket);
            let staged = self.alloc_lent::<S>(elems)?;
            // Bucket k holds the k-th piece of every rank's shard (`ShardBuckets::pack`).
            let packed = (0..part.world()).try_for_each(|r| {
                let src = Span::new(tmp, layout.source(bucket, r));
                let dst = Span::new(staged, layout.segment(bucket, r));
                self.kernels
                    .narrow(&mut self.arena, S::DTYPE, src, dst, scale)
            });
            free_on_error(&mut self.arena, staged, packed)?;
            let (op, what) = match self.units.policies[unit].reduce {
                GradReduce::AllReduce => {
                    self.progress.traffic.all_reduce += elems as u64;
                    (InPlace::AllReduceAvg, "all-reduce")
                }
                GradReduce::ReduceScatter => {
                    self.progress.traffic.reduce_scatter += elems as u64;
                    (InPlace::ReduceScatterAvg, "reduce-scatter")
                }
            };
            let launched = Launched::now(what, unit, elems * std::mem::size_of::<S>());
            let flight = self
                .collectives
                .launch(&self.comm, &mut self.arena, S::DTYPE, op, staged);
            let flight = free_on_error(&mut self.arena, staged, flight)?;
            self.flights.reductions.push_back(InFlight::new::<S>(
                unit,
                layout,
                bucket,
                (flight, launched),
            ));
            self.complete_reductions(MAX_IN_FLIGHT)?;
        }
        Ok(())
    }

    /// Completes pending reductions, oldest first, until at most `keep` remain. By count, not
    /// by which happen to be done: the memory held never depends on timing, so the measured
    /// peak is the plan's on every run.
    pub(crate) fn complete_reductions(&mut self, keep: usize) -> Result<()> {
        while self.flights.reductions.len() > keep {
            if let Some(pending) = self.flights.reductions.pop_front() {
                pending.finish(self)?;
            }
        }
        Ok(())
    }

    /// Accumulates a completed bucket of `unit` (laid out by `layout`, in `staged`) into the
    /// gradient this rank keeps, wherever it lives (`grad_home`).
    pub(crate) fn accumulate_reduced<S: Store>(
        &mut self,
        unit: usize,
        layout: ShardBuckets,
        bucket: Bucket,
        staged: Handle,
    ) -> Result<()> {
        let policy = self.units.policies[unit];
        let rank = self.comm.rank();
        let grads = self.units.bufs[unit].grads;
        let result = policy.kept_segments(rank).try_for_each(|j| {
            let piece = Span::new(staged, layout.segment(bucket, j));
            let at = policy.grad_index(rank, j, bucket.offset);
            let acc = Span::new(grads, at..at + bucket.len);
            self.accumulate_kept(S::DTYPE, acc, piece)
        });
        free_after(&mut self.arena, staged, result)
    }

    /// Marks the end of one micro-step (for gradient accumulation): completes every
    /// reduction still in flight, so each micro-step starts from the same memory and the
    /// plan's replay of one micro-step holds for all.
    ///
    /// # Errors
    /// A micro-step that did not make every declared call; collective or arena failures of
    /// the reductions completed here.
    pub(crate) fn end_micro_step(&mut self) -> Result<()> {
        self.complete_reductions(0)?;
        self.progress.micro_steps += 1;
        Ok(())
    }
}
