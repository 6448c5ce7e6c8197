//! [`Collectives`] over NCCL (feature `cuda`): one rank per GPU, each collective enqueued on
//! the [`NcclComm`]'s stream over the device addresses of a CUDA arena's blocks.
//!
//! Soundness of handing block addresses to NCCL (the caller's half of zero-comm's S3/S4,
//! cited by the `// SAFETY:` comments below):
//! - N0 (visibility): the arena's stream is synchronised before an address is handed over,
//!   so every copy and kernel queued there (the engine's kernels) has finished writing it;
//!   the communicator's stream is another one.
//! - N1 (bounds): every address is a live block's first byte (from the arena's device view,
//!   under the engine's `&mut Arena`) plus an offset that [`Span`]'s check keeps inside the
//!   block, on the communicator's GPU (checked against the arena's device); NCCL's counts
//!   come from zero-comm's length plan over those ranges.
//! - N2 (exclusive): a launched block is pinned until its flight lands, so the arena refuses
//!   to view, move, free or lend it meanwhile; a blocking all-gather holds `&mut Arena` for
//!   its whole run, so no other access to either block exists.
//! - N3 (completion): every call waits for its [`NcclWork`](zero_comm::nccl::NcclWork) before
//!   it returns (a timeout aborts the communicator, which stops its kernels, first), so NCCL
//!   no longer touches a block when the engine views it again or the flight unpins it.
//!
//! Decision: a launch waits for NCCL before it returns, like the device-local path: a flight
//! must be `Send` (the engine's in-flight queue is), and a pending `NcclWork` is not (S2).
//! Rejected: an `unsafe impl Send` for a wrapper of the work.
//!
//! Nothing in this module has run on a GPU yet (see `docs/nccl.md`).

use zero_alloc::{Arena, Device, Handle};
use zero_comm::nccl::{NcclComm, RawDeviceBuf};
use zero_comm::{Collective, Communicator, DType};

use super::{span_offset, Collectives, Flight, InPlace};
use crate::error::{Error, Result};
use crate::kernels::Span;

/// Model-state collectives of one NCCL rank. Not `Send` (the communicator is bound to the
/// thread that made it): build it, and the engine's ops around it, in the rank's thread.
#[derive(Debug)]
pub struct NcclCollectives {
    comm: NcclComm,
}

impl NcclCollectives {
    /// Collectives over `comm`'s group, for arenas on `comm`'s GPU.
    pub fn new(comm: NcclComm) -> Self {
        Self { comm }
    }

    /// The communicator.
    pub fn comm(&self) -> &NcclComm {
        &self.comm
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
            ptr: arena.device_view(span.block)?.ptr + offset,
            len: span.len,
        })
    }

    /// Launches one collective and waits for it (N3).
    ///
    /// # Safety
    /// The buffers satisfy N0-N2 until this returns.
    unsafe fn run(
        &self,
        call: Collective,
        dtype: DType,
        send: Option<RawDeviceBuf>,
        recv: RawDeviceBuf,
    ) -> Result<()> {
        let mut group = self.comm.group();
        // SAFETY: the caller's N0-N2; N3: the work is waited for below, before returning,
        // and a failed wait has aborted the communicator.
        unsafe { group.push_raw(call, dtype, send.is_none(), send, Some(recv))? };
        group.launch()?.wait()?;
        Ok(())
    }
}

impl Collectives for NcclCollectives {
    fn name(&self) -> &'static str {
        "nccl"
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
        arena.synchronize()?;
        // SAFETY: N0 (synchronised above), N1 (both ranges inside live blocks on the
        // communicator's GPU, distinct blocks as the engine passes them), N2 (`&mut Arena`
        // held for the whole call).
        unsafe { self.run(Collective::AllGather, dtype, Some(send), recv) }
    }

    fn launch(
        &mut self,
        _comm: &Communicator,
        arena: &mut Arena,
        dtype: DType,
        op: InPlace,
        block: Handle,
    ) -> Result<Flight> {
        let elems = arena.block(block)?.len / dtype.size();
        let buf = self.locate(arena, dtype, Span::new(block, 0..elems))?;
        let call = op.collective();
        arena.synchronize()?;
        arena.pin(block)?;
        // SAFETY: N0 (synchronised above), N1 (the whole live block), N2 (pinned from here
        // until the flight lands, which is after `run` returned).
        let ran = unsafe { self.run(call, dtype, None, buf) };
        Ok(Flight::finished(block, ran))
    }
}
