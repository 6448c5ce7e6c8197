//! [`Collectives`] over zero-comm's device-local protocol: ranks are threads of one process,
//! each collective reads the peers' blocks by address. Generic over the protocol's
//! [`DeviceOps`]: `CudaOps` for blocks of CUDA arenas (ranks sharing one GPU), [`HostOps`]
//! for host arenas, which is how the CPU tests run the path a GPU takes.
//!
//! Soundness of handing block addresses to the protocol (cited by the `// SAFETY:` comments
//! below):
//! - A0 (visibility): the arena's stream is synchronised before any address is handed over,
//!   so every copy and kernel queued there (the engine's kernels) has finished; the rank's
//!   own stream is another one.
//! - A1 (bounds): every address is a live block's first byte (from [`BlockAddress`], under
//!   the engine's `&mut Arena`) plus an offset that [`Span`]'s check keeps inside the block.
//! - A2 (exclusive): a launched block is pinned until its flight lands, so the arena refuses
//!   to view, move, free or lend it meanwhile; a blocking all-gather holds `&mut Arena` for
//!   its whole run, so no other access to either block exists.
//! - A3 (completion): a flight lands only after [`DeviceOps::synchronize`] on the rank's
//!   stream, which orders after the protocol's final wait on every peer (zero-comm's S4), so
//!   no rank still reads or writes the block when it is unpinned.

use zero_alloc::{Arena, Handle};
use zero_comm::device_local::{DeviceLocalComm, DeviceOps, HostOps, RawBuf};
use zero_comm::{Collective, Communicator, DType};

use super::{span_offset, Collectives, Flight, InPlace};
use crate::error::Result;
use crate::kernels::Span;

/// The address of a block's first byte as the protocol's operations take it: a host address
/// with its provenance exposed for [`HostOps`], a device address for `CudaOps`.
pub type BlockAddress = fn(&mut Arena, Handle) -> zero_alloc::Result<u64>;

/// Model-state collectives of one rank of a device-local group.
pub struct DeviceLocalCollectives<O: DeviceOps> {
    comm: DeviceLocalComm<O>,
    address: BlockAddress,
}

impl<O: DeviceOps> std::fmt::Debug for DeviceLocalCollectives<O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceLocalCollectives")
            .field("rank", &self.comm.rank())
            .field("size", &self.comm.size())
            .finish_non_exhaustive()
    }
}

impl<O: DeviceOps> DeviceLocalCollectives<O> {
    /// Collectives over `comm`'s group, finding blocks with `address`.
    pub fn new(comm: DeviceLocalComm<O>, address: BlockAddress) -> Self {
        Self { comm, address }
    }

    /// The address of `span` (elements of `dtype`) inside its block, checked to fit.
    fn locate(&self, arena: &mut Arena, dtype: DType, span: Span) -> Result<RawBuf> {
        let offset = span_offset(arena, dtype, span, "device-local collective")?;
        Ok(RawBuf {
            addr: (self.address)(arena, span.block)? + offset,
            len: span.len,
        })
    }
}

impl DeviceLocalCollectives<HostOps> {
    /// Collectives over host arenas.
    pub fn host(comm: DeviceLocalComm<HostOps>) -> Self {
        Self::new(comm, host_address)
    }
}

#[cfg(feature = "cuda")]
impl DeviceLocalCollectives<zero_comm::device_local::cuda::CudaOps> {
    /// Collectives over CUDA arenas: ranks are threads sharing one GPU.
    pub fn cuda(comm: DeviceLocalComm<zero_comm::device_local::cuda::CudaOps>) -> Self {
        Self::new(comm, |arena, block| Ok(arena.device_view(block)?.ptr()))
    }
}

/// A host block's address, exposed for [`HostOps`] (which turns it back into a pointer).
fn host_address(arena: &mut Arena, block: Handle) -> zero_alloc::Result<u64> {
    let bytes = arena.slice_mut::<u8>(block)?;
    Ok(bytes.as_mut_ptr().expose_provenance() as u64)
}

impl<O: DeviceOps + 'static> Collectives for DeviceLocalCollectives<O> {
    fn name(&self) -> &'static str {
        "device-local"
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
        // The rank's stream is not the arena's: what the arena's stream wrote must be done.
        arena.synchronize()?;
        // SAFETY: A0 (synchronised above), A1 (both ranges inside live blocks, distinct
        // blocks as the engine passes them) and A2 (`&mut Arena` held for the whole call);
        // the synchronisation below ends every access before the call returns.
        unsafe {
            self.comm
                .run_raw(Collective::AllGather, dtype, Some(send), recv)?;
        }
        self.comm.ops().synchronize()?;
        Ok(())
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
        // SAFETY: A0 (synchronised above), A1 (the whole live block), A2 (pinned from here
        // until the flight lands).
        let launched = unsafe { self.comm.run_raw(call, dtype, None, buf) };
        if let Err(e) = launched {
            arena.unpin(block)?;
            return Err(e.into());
        }
        // Waited for here, so the collective does not overlap the engine's next work on
        // the GPU: `DeviceOps` has no host wait on one event that a landing could keep.
        let synced = self.comm.ops().synchronize().map_err(Into::into);
        Ok(Flight::finished(block, synced))
    }
}
