//! The offload protocol on a GPU (feature `cuda`): the staging slots are device blocks lent
//! from the rank's CUDA arena, the host buffers are page-locked by the driver
//! (`PinnedBuffer::cuda`), and the copies are `cuMemcpyDtoHAsync` / `cuMemcpyHtoDAsync` on a
//! copy stream of the rank's context, ordered against the compute stream (the context's
//! default stream, where the model's kernels, the engine's kernels and the arena's copies
//! run) by events. A job counts as done once it is ordered on the copy stream: the host
//! never waits for a copy; the compute stream does, on the slot's event.
//!
//! Soundness (cited by every `// SAFETY:` in this file):
//! - O1 (copy after compute): before each copy the copy stream waits on an event recorded on
//!   the compute stream just then, so a copy out reads a slot after the compute stream wrote
//!   it (`stage`), and a fetch overwrites a slot after the compute stream's earlier reads of
//!   it (`unstage`) ran.
//! - O2 (compute after copy): each slot carries an event recorded on the copy stream after
//!   its latest copy; the compute stream waits on it before it writes the slot (the copy out
//!   has finished reading it) and before it reads it (the fetch has landed).
//! - O3 (host buffers): owned here; their addresses are taken once, when no copy exists, and
//!   from then on only the copy stream touches them, in queue order: a fetch of segment s
//!   reads what the copy out of s wrote, a later copy out of s overwrites them only after an
//!   earlier fetch of s read them. Drop waits for the copy stream before they are freed.
//! - O4 (bounds): every copy moves one input, 4*N*C bytes: a slot is a whole lent block of
//!   N*C floats (`Offloader::new` checks it), a host buffer is N*C floats (made here), a model
//!   view is N*C floats (`check_kept_call`, asserted again below); a lent block is pinned
//!   for good and its loan keeps the device memory alive (the bridge's D2).

use std::collections::VecDeque;
use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::{sys, CudaEvent, CudaStream, DriverError};
use zero::Engine;
use zero_alloc::{Device, LentDevice, PinnedBuffer};
use zero_gpt::cuda::DeviceSlice;
use zero_gpt::GptError;

use super::protocol::{Copier, Done, Job, Offloader};
use super::{input_bytes, staging_slots};
use crate::bridge::StepError;

/// A staging slot: a device block of one (N,C) input and the event after its latest copy.
#[derive(Debug)]
pub(crate) struct DeviceSlot {
    lent: LentDevice,
    copied: CudaEvent,
}

/// The copy stream and the host buffers, one per segment.
#[derive(Debug)]
pub(crate) struct StreamCopier {
    compute: Arc<CudaStream>,
    copy: Arc<CudaStream>,
    /// Recorded on the compute stream before each copy (O1).
    compute_mark: CudaEvent,
    /// Owned for their addresses below; not touched by the host (O3).
    _hosts: Vec<PinnedBuffer>,
    host_addrs: Vec<usize>,
    queued: VecDeque<Done<DeviceSlot>>,
}

fn driver(op: &'static str) -> impl Fn(DriverError) -> GptError {
    move |e| GptError::Cuda {
        op,
        message: format!("{e:?}"),
    }
}

fn reason(op: &'static str) -> impl Fn(DriverError) -> String {
    move |e| format!("CUDA {op} failed: {e:?}")
}

/// Offloaded kept inputs on the GPU of `engine`'s arena, for `segments` inputs of
/// `input_len` (N*C) floats: the slots lent from the arena for good (the plan's
/// [`staging_slots`] blocks of one input, as on the CPU), the host buffers pinned. `compute`
/// is the stream the model's kernels run on (the copier's O1/O2 order against it), on the
/// arena's GPU.
///
/// # Errors
/// A host arena; arena errors (a cap too small); a refused driver call.
pub(crate) fn offloaded_device_inputs(
    engine: &mut Engine,
    compute: &Arc<CudaStream>,
    segments: usize,
    input_len: usize,
) -> Result<Offloader<StreamCopier>, StepError> {
    let ordinal = match engine.arena().device() {
        Device::Cuda(ordinal) => ordinal,
        other => {
            let reason = format!("device offload needs a CUDA arena, not one on {other}");
            return Err(zero::Error::Order(reason).into());
        }
    };
    // The device's primary context, the one the arena and the model's backend use, untracked
    // like theirs: this file orders its streams by the events above (O1, O2).
    let ctx = zero_alloc::context::untracked_context(ordinal).map_err(GptError::from)?;
    let mut slots = Vec::new();
    for _ in 0..staging_slots(segments) {
        slots.push(DeviceSlot {
            lent: engine.lend_device_f32(input_len)?,
            copied: ctx.new_event(None).map_err(driver("cuEventCreate"))?,
        });
    }
    let bytes = input_bytes(input_len)?;
    let mut hosts = (0..segments)
        .map(|_| PinnedBuffer::cuda(ordinal, bytes).map_err(zero::Error::from))
        .collect::<Result<Vec<_>, _>>()?;
    let host_addrs = hosts
        .iter_mut()
        .map(|h| h.as_bytes_mut().as_mut_ptr() as usize)
        .collect();
    let copier = StreamCopier {
        compute: Arc::clone(compute),
        copy: ctx.new_stream().map_err(driver("cuStreamCreate"))?,
        compute_mark: ctx.new_event(None).map_err(driver("cuEventCreate"))?,
        _hosts: hosts,
        host_addrs,
        queued: VecDeque::new(),
    };
    Ok(Offloader::new(copier, slots, segments, input_len)?)
}

impl StreamCopier {
    /// Queues one copy between `slot` and `segment`'s host buffer on the copy stream.
    fn enqueue(&self, segment: usize, slot: &DeviceSlot, to_host: bool) -> Result<(), String> {
        let Some(&host) = self.host_addrs.get(segment) else {
            return Err(format!("no host buffer for segment {segment}"));
        };
        let bytes = slot.lent.len();
        self.compute_mark
            .record(&self.compute)
            .map_err(reason("cuEventRecord"))?;
        self.copy
            .wait(&self.compute_mark)
            .map_err(reason("cuStreamWaitEvent"))?;
        let stream = self.copy.cu_stream();
        // SAFETY: O4 (the slot is one input; so is the host buffer, made for that length),
        // O1 (ordered after the compute stream's uses of the slot), O3 (only this stream
        // touches the host buffer, which outlives the copy); the context is current (bound
        // by the record above).
        let queued = unsafe {
            if to_host {
                sys::cuMemcpyDtoHAsync_v2(host as *mut c_void, slot.lent.ptr(), bytes, stream)
            } else {
                sys::cuMemcpyHtoDAsync_v2(slot.lent.ptr(), host as *const c_void, bytes, stream)
            }
        };
        let op = if to_host {
            "cuMemcpyDtoHAsync"
        } else {
            "cuMemcpyHtoDAsync"
        };
        queued.result().map_err(reason(op))?;
        // O2: the compute stream's next use of the slot waits for this copy.
        slot.copied
            .record(&self.copy)
            .map_err(reason("cuEventRecord"))
    }

    /// `dst = src`, `bytes` of device memory, on the compute stream after `slot`'s copy.
    fn compute_copy(
        &self,
        slot: &DeviceSlot,
        dst: u64,
        src: u64,
        len: usize,
    ) -> Result<(), String> {
        assert_eq!(4 * len, slot.lent.len(), "a kept input and its slot (O4)");
        self.compute
            .wait(&slot.copied)
            .map_err(reason("cuStreamWaitEvent"))?;
        // SAFETY: O4 (asserted: both sides hold one input), O2 (after the slot's latest
        // copy); the model's view and the lent slot are distinct blocks; the context is
        // current (bound by the wait above).
        let r = unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, 4 * len, self.compute.cu_stream()) };
        r.result().map_err(reason("cuMemcpyDtoDAsync"))
    }
}

impl Copier for StreamCopier {
    type Slot = DeviceSlot;
    type View = DeviceSlice;

    fn slot_len(slot: &DeviceSlot) -> usize {
        slot.lent.len() / 4
    }

    fn send(&mut self, job: Job<DeviceSlot>) -> Result<(), String> {
        let Some((segment, slot, fetch)) = job.into_parts() else {
            return Err("a copy job panicked (injected by a test)".into());
        };
        self.enqueue(segment, &slot, fetch.is_none())?;
        self.queued.push_back(Done {
            segment,
            slot,
            fetch,
            result: Ok(()),
        });
        Ok(())
    }

    fn in_flight(&self) -> usize {
        self.queued.len()
    }

    fn recv(&mut self) -> Option<Done<DeviceSlot>> {
        self.queued.pop_front()
    }

    fn stage(&mut self, slot: &mut DeviceSlot, input: &DeviceSlice) -> Result<(), String> {
        self.compute_copy(slot, slot.lent.ptr(), input.addr(), input.len())
    }

    fn unstage(&mut self, slot: &DeviceSlot, input: &mut DeviceSlice) -> Result<(), String> {
        self.compute_copy(slot, input.addr(), slot.lent.ptr(), input.len())
    }
}

impl Drop for StreamCopier {
    fn drop(&mut self) {
        // O3: no copy may outlive the host buffers freed after this. When the wait fails
        // (a device error, or a stale error cudarc reports before waiting) the copies may
        // still run, so the host buffers are leaked rather than freed under them.
        if let Err(e) = self.copy.synchronize() {
            tracing::warn!(error = ?e, "waiting for the activation offload copies failed; leaking their pinned host buffers");
            std::mem::forget(std::mem::take(&mut self._hosts));
        }
    }
}
