//! [`CudaBackend`]: the [`crate::Backend`] kernels on one GPU: cuBLAS `cublasGemmEx` and
//! `cublasGemmStridedBatchedEx` for the matrix products (the layers' and attention's), in
//! the backend's [`GemmMath`] mode, the NVRTC-compiled kernels of `kernels/*.cu` for the rest.
//!
//! Legend: B batch, T sequence, C channels, OC output channels, NH heads, N = B*T rows,
//! V vocabulary, Vp padded vocabulary.
//!
//! Ordering: every launch goes to the backend's one stream, and views are made on that
//! stream ([`DeviceSlice::of`]), so stream order alone sequences the kernels. The context is
//! untracked (`zero_alloc::context`): views record no cudarc events. Errors: the
//! trait's methods return nothing (the CPU kernels cannot fail), so a failed launch is
//! recorded and the first one is returned by the next [`CudaBackend::synchronize`], as
//! cudarc reports errors raised inside `Drop`. Buffers of the wrong length are caller bugs
//! and panic, as on the CPU.

// The llm.c signature (outputs, inputs, then every dimension) is the point of the trait.
#![allow(clippy::too_many_arguments)]

use std::sync::{Arc, Mutex, PoisonError};

use cudarc::driver::{CudaSlice, CudaStream, DevicePtrMut, LaunchConfig, PushKernelArg};

use super::attention_gemm::{AttentionScratch, AttentionShape};
use super::blas_handle::BlasHandle;
use super::device::{DeviceIds, DeviceSlice};
use super::gemm::GemmMath;
use super::geometry::{self as geo, Geometry};
use super::reductions::{self, ReductionScratch};
use super::sources::KERNELS;
use crate::{Buffer, GptError, Result};
use zero_alloc::nvrtc::LoadedKernels;

/// One kernel argument, by value (the launch passes the address of each).
#[derive(Debug, Clone, Copy)]
pub(super) enum Arg {
    U32(u32),
    U64(u64),
}

/// A device view's address as a kernel argument.
pub(super) fn addr(s: &DeviceSlice) -> Arg {
    Arg::U64(s.addr())
}

pub(super) fn ids(s: &DeviceIds) -> Arg {
    Arg::U64(s.addr())
}

pub(super) fn driver_err(op: &'static str) -> impl Fn(cudarc::driver::DriverError) -> GptError {
    move |e| GptError::Cuda {
        op,
        message: format!("{e:?}"),
    }
}

/// The GPT-2 kernels on one CUDA device.
#[derive(Debug)]
pub struct CudaBackend {
    stream: Arc<CudaStream>,
    pub(super) blas: BlasHandle,
    kernels: Arc<LoadedKernels>,
    /// How every matrix product of this backend is computed.
    pub(super) math: GemmMath,
    /// The kernels' scratch: attention's regions and the column reductions' partials.
    scratch: Mutex<Scratch>,
    /// The grouped token ids (`reductions`).
    pub(super) reductions: ReductionScratch,
    /// The first launch error since the last `synchronize`.
    first_error: Mutex<Option<GptError>>,
}

impl CudaBackend {
    /// A backend on device `ordinal`: checks for the driver, cuBLAS and NVRTC, creates a
    /// stream and a cuBLAS handle on it, and compiles the kernels (once per device).
    ///
    /// # Errors
    /// [`GptError::CudaUnavailable`] naming the first missing library (never a panic);
    /// [`GptError::Cuda`] when the device does not exist or a driver/cuBLAS call fails;
    /// [`GptError::Nvrtc`] when a kernel does not compile.
    pub fn new(ordinal: usize) -> Result<Self> {
        Self::build(ordinal, false)
    }

    /// As [`CudaBackend::new`], with every kernel on the context's default stream: the stream
    /// zero-alloc's CUDA arenas order their copies on and the ZeRO engine's CUDA kernels run
    /// on, so a model whose buffers are arena blocks needs no host synchronisation to stay in
    /// order with the engine. Ranks of one process that share the GPU then share the stream.
    ///
    /// # Errors
    /// As [`CudaBackend::new`].
    pub fn on_default_stream(ordinal: usize) -> Result<Self> {
        Self::build(ordinal, true)
    }

    fn build(ordinal: usize, default_stream: bool) -> Result<Self> {
        super::available()?;
        // Untracked (zero_alloc::context): views carry no events; the stream orders.
        let ctx = zero_alloc::context::untracked_context(ordinal)?;
        let stream = if default_stream {
            ctx.default_stream()
        } else {
            ctx.new_stream().map_err(driver_err("cuStreamCreate"))?
        };
        let blas = BlasHandle::new(Arc::clone(&stream)).map_err(|e| GptError::Cuda {
            op: "cublasCreate",
            message: format!("{e:?}"),
        })?;
        let kernels = LoadedKernels::for_context(&ctx, &KERNELS)?;
        Ok(Self {
            stream,
            blas,
            kernels,
            math: GemmMath::default(),
            scratch: Mutex::new(Scratch::default()),
            reductions: ReductionScratch::default(),
            first_error: Mutex::new(None),
        })
    }

    /// This backend with every matrix product (the layers' and attention's) computed in
    /// `math` mode; [`GemmMath::Exact`] unless set.
    #[must_use]
    pub fn with_gemm_math(mut self, math: GemmMath) -> Self {
        self.math = math;
        self
    }

    /// Sets the math mode of the matrix products launched from now on.
    pub fn set_gemm_math(&mut self, math: GemmMath) {
        self.math = math;
    }

    /// The math mode of the matrix products.
    #[must_use]
    pub fn gemm_math(&self) -> GemmMath {
        self.math
    }

    /// The stream every kernel of this backend runs on; allocate and copy on it.
    #[must_use]
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Waits for every launched kernel; returns the first error recorded since the last call.
    ///
    /// # Errors
    /// The first failed launch or gemm, else a failed stream synchronisation.
    pub fn synchronize(&self) -> Result<()> {
        let first = self
            .first_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        self.synchronize_stream()?;
        first.map_or(Ok(()), Err)
    }

    pub(super) fn record(&self, result: Result<()>) {
        if let Err(e) = result {
            let mut slot = self
                .first_error
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            slot.get_or_insert(e);
        }
    }

    /// Launches kernel `name` with `args` on the stream, or records why it could not.
    ///
    /// Callers check that every buffer holds the elements the kernel indexes for the
    /// dimensions they pass (each kernel's comment in `kernels/*.cu` states them), and that
    /// `args` matches the kernel's parameter list in order and type.
    pub(super) fn launch(
        &self,
        name: &'static str,
        geometry: Result<Geometry>,
        args: Result<Vec<Arg>>,
    ) {
        let result = self.bind_context().and(geometry).and_then(|g| {
            let args = args?;
            if g.is_empty() {
                return Ok(());
            }
            let f = self.kernels.get(name).ok_or_else(|| GptError::Cuda {
                op: "kernel lookup",
                message: format!("no kernel named {name} in sources::SOURCES"),
            })?;
            let mut builder = self.stream.launch_builder(f);
            for a in &args {
                match a {
                    Arg::U32(v) => builder.arg(v),
                    Arg::U64(v) => builder.arg(v),
                };
            }
            let cfg = LaunchConfig {
                grid_dim: (g.grid, 1, 1),
                block_dim: (g.block, 1, 1),
                shared_mem_bytes: g.shared_bytes,
            };
            // SAFETY: per this function's contract the arguments match the kernel's
            // parameters and every buffer is large enough for the indices the kernel forms
            // from the dimensions; all work is ordered on self.stream, and the views borrow
            // their allocations for the whole call.
            unsafe { builder.launch(cfg) }
                .map(|_| ())
                .map_err(driver_err(name))
        });
        self.record(result);
    }

    /// The address of the kernels' scratch, at least `len` f32: the provided buffer when it
    /// is that long, else memory of the backend's own, grown when smaller. Contents are
    /// undefined (not zeroed).
    ///
    /// Attention and the column reductions both use it from element 0: each writes every
    /// element it reads within one method call, and the stream runs one call after another,
    /// so neither's contents outlive its call. Rejected: disjoint regions, which would add
    /// the partials (3 MB at GPT-2 124M, B = 16, T = 1024) to the peak for nothing.
    pub(super) fn scratch(&self, len: usize) -> Result<u64> {
        let mut slot = self.scratch.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(provided) = slot.provided.as_mut() {
            if provided.floats().len() >= len {
                return Ok(provided.floats_mut().addr());
            }
        }
        if slot.own.as_ref().is_none_or(|s| s.len() < len) {
            // SAFETY: the users are attention (cuda/attention.rs) and the column reductions
            // (cuda/reductions.rs), which write every scratch element before reading it, in
            // stream order. Forward: split_heads writes q, k, v; scores writes att (not the
            // scratch); weighted_values reads v and att and writes y (beta = 0: C is not
            // read); merge_heads reads y. Backward: split_heads writes q, k, v and y (dout);
            // d_values reads y, att, writes dv; d_weights reads y, v, writes the scores
            // region; attention_softmax_backward reads and rewrites it; d_queries, d_keys
            // read it with k, q and write dq, dk; merge_heads reads dq, dk, dv.
            // attention_gemm's tests run these steps on a scratch of NaN, which any
            // read-before-write would carry into the results. A reduction's first stage
            // writes partials (quantities, chunks, cols) whole and its second reads them.
            // f32 has no invalid bit patterns.
            let fresh = unsafe { self.stream.alloc::<f32>(len.max(1)) };
            slot.own = Some(fresh.map_err(driver_err("cuMemAlloc"))?);
        }
        match slot.own.as_mut() {
            Some(s) => Ok(s.device_ptr_mut(&self.stream).0),
            None => unreachable!("filled above"),
        }
    }

    /// f32 elements of scratch a forward and backward of (B, T) with `c` channels and `nh`
    /// heads uses: the larger of attention's layout and the widest column reduction's
    /// partials (the two share the scratch, [`CudaBackend::scratch`]).
    ///
    /// # Errors
    /// [`GptError::LaunchTooLarge`] for a shape whose scratch or launches do not fit.
    pub fn scratch_elements(b: usize, t: usize, c: usize, nh: usize) -> Result<usize> {
        if b == 0 || t == 0 || c == 0 {
            return Ok(0); // attention and the reductions launch nothing
        }
        let attention = AttentionScratch::new(AttentionShape::new(b, t, c, nh)?)?.len;
        let n = geo::checked_product("scratch", "B*T", &[b, t])?;
        Ok(attention.max(reductions::widest_partials(n, c)?))
    }

    /// Takes `scratch` as the kernels' scratch from now on; memory of the backend's own is
    /// freed once the stream has finished with it.
    pub(super) fn take_scratch(&self, scratch: Buffer<DeviceSlice>) {
        let mut slot = self.scratch.lock().unwrap_or_else(PoisonError::into_inner);
        // The buffer being replaced may still be read by queued kernels: wait for them
        // before it goes (a provided one returns to its owner, who may hand it out again).
        if slot.provided.is_some() {
            self.record(self.synchronize_stream());
        }
        slot.provided = Some(scratch);
        slot.own = None;
    }

    /// Bytes of scratch allocated by the backend itself (see [`CudaBackend::scratch`]).
    pub(super) fn own_scratch_bytes(&self) -> u64 {
        let slot = self.scratch.lock().unwrap_or_else(PoisonError::into_inner);
        slot.own.as_ref().map_or(0, |s| 4 * s.len() as u64)
    }

    fn synchronize_stream(&self) -> Result<()> {
        self.bind_context()?;
        self.stream
            .synchronize()
            .map_err(driver_err("cuStreamSynchronize"))
    }
}

/// The kernels' scratch: a buffer the caller provided ([`crate::Backend::provide_scratch`])
/// and the backend's own memory, used only when none, or too small a one, was provided.
#[derive(Debug, Default)]
struct Scratch {
    provided: Option<Buffer<DeviceSlice>>,
    own: Option<CudaSlice<f32>>,
}

/// `head` followed by the u32 dimension arguments `named` of `kernel`, or the first
/// dimension that does not fit a u32.
pub(super) fn with_dims(
    kernel: &'static str,
    mut head: Vec<Arg>,
    named: &[(&'static str, usize)],
) -> Result<Vec<Arg>> {
    for &(what, v) in named {
        head.push(Arg::U32(geo::as_u32(kernel, what, v)?));
    }
    Ok(head)
}

#[cfg(test)]
mod tests {
    use super::CudaBackend;

    #[test]
    fn the_scratch_is_attentions_layout_at_gpt2_shapes() {
        // 7 (B,NH,T,hs) regions and one (B,NH,T,T), by the formula: 4 * (7*B*T*C + B*NH*T*T)
        // bytes, 1,157,627,904 at GPT-2 124M, B = 16, T = 1024.
        for (b, t, c, nh) in [(16, 1024, 768, 12), (4, 64, 32, 2), (1, 1, 8, 1)] {
            let want = 7 * b * t * c + b * nh * t * t;
            assert_eq!(CudaBackend::scratch_elements(b, t, c, nh).unwrap(), want);
        }
        assert_eq!(
            4 * CudaBackend::scratch_elements(16, 1024, 768, 12).unwrap(),
            1_157_627_904
        );
    }

    #[test]
    fn no_rows_need_no_scratch_and_an_overflowing_shape_is_an_error() {
        assert_eq!(CudaBackend::scratch_elements(0, 1024, 768, 12).unwrap(), 0);
        assert_eq!(CudaBackend::scratch_elements(16, 0, 768, 12).unwrap(), 0);
        assert!(CudaBackend::scratch_elements(usize::MAX, 1024, 768, 12).is_err());
    }
}
