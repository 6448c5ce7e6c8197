//! [`Collectives`] over NCCL (feature `cuda`): one rank per GPU, each collective enqueued on
//! the [`NcclComm`]'s stream over the device addresses of a CUDA arena's blocks.
//!
//! Protocol: `stream_order.rs`'s, with [`NcclWork`] as the work. No host wait at launch or at
//! landing; the host waits only in the blocking [`Collectives::all_gather`], in
//! [`NcclCollectives::settle`] and when a flight is dropped without landing. Device-local
//! collectives (`device_local.rs`) keep their host-driven protocol: their ranks are threads
//! that meet on the host, so there is no stream to order by.
//!
//! Soundness of handing block addresses to NCCL (the caller's half of zero-comm's S3/S4,
//! cited by the `// SAFETY:` comments below):
//! - N0 (visibility): before an address is handed over, the communicator's stream waits for
//!   an event recorded on the arena's stream ([`NcclComm::wait_for`]), so every copy, move
//!   and kernel queued there has written the block before NCCL reads it. The engine's
//!   kernels run on the context's default stream, which is the arena's.
//! - N1 (bounds): every address is a live block's first byte (from the arena's device view,
//!   under the engine's `&mut Arena`) plus an offset that [`Span`]'s check keeps inside the
//!   block, on the communicator's GPU (checked against the arena's device); NCCL's counts
//!   come from zero-comm's length plan over those ranges.
//! - N2 (exclusive): a launched block is pinned before NCCL is called and until its flight
//!   lands, so the arena refuses to view (hence to hand to a kernel), move, free or lend it
//!   meanwhile; a blocking all-gather holds `&mut Arena` until its work finished.
//! - N3 (completion): landing makes the arena's stream wait for the work's event
//!   ([`NcclWork::then`]) before it unpins the block, so every later kernel, copy, move, free
//!   and host read (which synchronises the arena's stream first; so do zero-alloc's offload
//!   copies) comes after NCCL's writes. A blocking all-gather does the same, then waits on the
//!   host. A failed or timed-out wait aborts the communicator, which stops its kernels, so the
//!   event completes. NCCL's asynchronous errors surface at landing (one poll), at the next
//!   launch (a poll of every landed, unfinished work, which also turns a passed deadline into
//!   zero-comm's timeout), and at the next blocking all-gather or [`NcclCollectives::settle`].
//! - N4 (drop): a flight dropped without landing waits for its work on the host (bounded by
//!   the communicator's timeout; the outcome is logged) and leaves its block pinned, so the
//!   arena never moves, reuses or frees bytes NCCL may still write. The engine declares its
//!   flight queues before its arena, so dropping an engine with flights in the air runs
//!   their waits before the arena frees its memory. The engine's optimizer step calls
//!   [`Collectives::settle`] (a host wait, bounded by the timeout, for every landed work)
//!   before it reads flags and norms on the host, so a dead peer is a timeout there, not a
//!   host read blocked forever behind NCCL on the arena's stream.
//!
//! Decision: a flight holds its `NcclWork` (not `Send`, zero-comm's S2; neither are
//! flights, nor the engine). Rejected: waiting for NCCL at launch, which serialised every
//! collective with the kernels the engine queues after it.
//!
//! Nothing in this module has run on a GPU yet (see `docs/nccl.md`).

use std::time::Instant;

use cudarc::driver::CudaStream;
use zero_alloc::{Arena, Device, Handle};
use zero_comm::nccl::{NcclComm, NcclWork, RawDeviceBuf};
use zero_comm::{Collective, Communicator, DType};

use super::stream_order::{StreamFlight, StreamWork, Unsettled};
use super::{span_offset, Collectives, Flight, InPlace};
use crate::error::{Error, Result};
use crate::kernels::Span;

/// Model-state collectives of one NCCL rank. Not `Send` (the communicator is bound to the
/// thread that made it): build it, and the engine's ops around it, in the rank's thread.
#[derive(Debug)]
pub struct NcclCollectives {
    comm: NcclComm,
    /// Landed collectives not yet seen to finish (N3).
    unsettled: Unsettled<NcclWork>,
}

impl NcclCollectives {
    /// Collectives over `comm`'s group, for arenas on `comm`'s GPU.
    pub fn new(comm: NcclComm) -> Self {
        Self {
            comm,
            unsettled: Unsettled::new(),
        }
    }

    /// The communicator.
    pub fn comm(&self) -> &NcclComm {
        &self.comm
    }

    /// Waits on the host for every landed collective not yet seen to finish.
    ///
    /// # Errors
    /// The first failure or timeout (the communicator is then aborted).
    pub fn settle(&mut self) -> Result<()> {
        self.unsettled.wait_all()
    }

    /// The device address of `span` (elements of `dtype`), checked to fit its block and the
    /// arena checked to be on the communicator's GPU (N1).
    fn locate(&self, arena: &mut Arena, dtype: DType, span: Span) -> Result<RawDeviceBuf> {
        let gpu = Device::Cuda(self.comm.device());
        if arena.device() != gpu {
            return Err(Error::Device {
                op: "nccl collective",
                message: format!(
                    "a block of an arena on {}; the communicator's GPU is {gpu}",
                    arena.device()
                ),
            });
        }
        let offset = span_offset(arena, dtype, span, "nccl collective")?;
        Ok(RawDeviceBuf {
            ptr: arena.device_view(span.block)?.ptr() + offset,
            len: span.len,
        })
    }

    /// Enqueues one collective after the work queued so far on the arena's stream (N0).
    ///
    /// # Safety
    /// The buffers satisfy N1 and N2 until the returned work is ordered before the arena's
    /// stream and finished, or waited for (N3, N4).
    unsafe fn enqueue(
        &self,
        arena: &Arena,
        call: Collective,
        dtype: DType,
        send: Option<RawDeviceBuf>,
        recv: RawDeviceBuf,
    ) -> Result<NcclWork> {
        self.comm.wait_for(arena_stream(arena)?)?;
        let mut group = self.comm.group();
        // SAFETY: N0 (the communicator's stream waits for the arena's, just above), the
        // caller's N1 and N2; the caller lands or waits for the work (N3, N4).
        unsafe { group.push_raw(call, dtype, send.is_none(), send, Some(recv))? };
        Ok(group.launch()?)
    }
}

/// The arena's stream, which orders its copies and the engine's kernels.
fn arena_stream(arena: &Arena) -> Result<&CudaStream> {
    match arena.cuda_stream() {
        Some(stream) => Ok(stream),
        None => Err(Error::Device {
            op: "nccl collective",
            message: format!("an arena on {} has no CUDA stream", arena.device()),
        }),
    }
}

impl StreamWork for NcclWork {
    fn order_before_arena(&self, arena: &Arena) -> Result<()> {
        Ok(self.then(arena_stream(arena)?)?)
    }

    fn poll(self) -> Result<Option<Self>> {
        if self.is_done()? {
            return Ok(None);
        }
        if Instant::now() < self.deadline() {
            return Ok(Some(self));
        }
        // Past the deadline `wait` polls once more and reports the timeout (aborting).
        self.wait()?;
        Ok(None)
    }

    fn wait(self) -> Result<()> {
        Ok(NcclWork::wait(self)?)
    }
}

impl Collectives for NcclCollectives {
    fn name(&self) -> &'static str {
        "nccl"
    }

    fn settle(&mut self) -> Result<()> {
        NcclCollectives::settle(self)
    }

    fn all_gather(
        &mut self,
        _comm: &Communicator,
        arena: &mut Arena,
        dtype: DType,
        src: Span,
        dst: Span,
    ) -> Result<()> {
        let send = self.locate(arena, dtype, src)?;
        let recv = self.locate(arena, dtype, dst)?;
        // SAFETY: N1 (both ranges inside live blocks on the communicator's GPU, distinct
        // blocks as the engine passes them), N2 (`&mut Arena` held until the wait below);
        // N3: the arena's stream is ordered after the work, which is then waited for.
        let work = unsafe { self.enqueue(arena, Collective::AllGather, dtype, Some(send), recv)? };
        if let Err(ordering) = work.order_before_arena(arena) {
            StreamWork::wait(work)?;
            return Err(ordering);
        }
        StreamWork::wait(work)?;
        // Every landed collective was enqueued before this one on the same stream.
        self.unsettled.wait_all()
    }

    fn launch(
        &mut self,
        _comm: &Communicator,
        arena: &mut Arena,
        dtype: DType,
        op: InPlace,
        block: Handle,
    ) -> Result<Flight> {
        self.unsettled.poll()?;
        let elems = arena.block(block)?.len / dtype.size();
        let buf = self.locate(arena, dtype, Span::new(block, 0..elems))?;
        arena.pin(block)?;
        // SAFETY: N1 (the whole live block), N2 (pinned just above, until the flight lands
        // or, dropped, has waited: N3, N4).
        match unsafe { self.enqueue(arena, op.collective(), dtype, None, buf) } {
            Ok(work) => Ok(Flight::new(StreamFlight::new(
                block,
                work,
                self.unsettled.clone(),
            ))),
            Err(failed) => {
                // zero-comm aborts the communicator (stopping its kernels) on every failure
                // but a failed event record after the enqueue; for that one, wait for the
                // communicator's stream before landing can unpin the block (N3).
                let drained = self.comm.stream().synchronize();
                if let Err(e) = drained {
                    tracing::warn!(error = ?e, "nccl: synchronising the communicator's stream");
                }
                Ok(Flight::finished(block, Err(failed)))
            }
        }
    }
}
