//! [`CudaKernels`]: the engine's passes on a CUDA arena, as NVRTC-compiled kernels launched
//! on the blocks' device addresses (feature `cuda`; not yet run on a GPU).
//!
//! Ordering: every copy, fill and launch goes to the context's default stream, the stream a
//! zero-alloc CUDA arena orders its own copies and defragmentation moves on, so stream order
//! alone sequences them; the host waits only where a result comes back (add_squares' sum,
//! and `take_overflow`, which the engine calls once a step for fp16 only: `accumulate`
//! notes an inf or NaN on the device without a wait).
//!
//! Contracts against [`super::HostKernels`]:
//! - fill_zero, copy: `cuMemsetD8Async` / `cuMemcpyDtoDAsync`: bitwise.
//! - widen, narrow, accumulate, and adamw's scaling, update and narrowing: element-wise
//!   kernels doing the host's f32 operations in its order under `--fmad=false`: bitwise (f16
//!   rounding by the PTX conversion: NaN payloads aside). accumulate's flag: exact.
//! - add_squares: f64 like the host, summed in another order (per-thread grid-stride sums,
//!   a tree per block, the host adds the block sums in block order): not bitwise; relative
//!   1e-12 of the host sum for inputs of moderate range.
//!
//! Geometry: `source::BLOCK` threads per block, a grid-stride loop, grid
//! `min(ceil(n / BLOCK), source::MAX_BLOCKS)` (`MAX_SUM_BLOCKS` for add_squares).

mod ops;
mod source;

use std::sync::{Arc, Mutex};

use cudarc::driver::PushKernelArg;
use cudarc::driver::{CudaSlice, CudaStream, DriverError, LaunchConfig};
use zero_alloc::nvrtc::LoadedKernels;
use zero_alloc::{AllocError, Arena, CudaLibrary, Device};

use super::Span;
use crate::error::{Error, Result};

pub use source::{ENGINE_KERNELS, ENGINE_KERNEL_SET, ENGINE_PROGRAM, ENGINE_SOURCE};

/// The engine's kernels on CUDA device `ordinal`: one per [`super::Kernels`] method and
/// storage type, compiled once per process and device.
#[derive(Debug)]
pub struct CudaKernels {
    ordinal: usize,
    stream: Arc<CudaStream>,
    functions: Arc<LoadedKernels>,
    /// The overflow note: `accumulate` sets it to 1 on the device, `take_overflow` reads
    /// and clears it (one host wait per step, and only for fp16).
    overflow: Mutex<CudaSlice<u32>>,
    /// `overflow`'s device address (fixed for its lifetime).
    overflow_at: u64,
}

/// Maps a driver error to [`Error::Device`] naming the call.
fn driver(op: &'static str) -> impl Fn(DriverError) -> Error {
    move |e| Error::Device {
        op,
        message: format!("{e:?}"),
    }
}

/// zero-alloc's CUDA setup errors (a missing library, NVRTC's log, a refused module) as
/// [`Error::Device`] naming what failed; anything else stays a memory error.
fn setup(e: AllocError) -> Error {
    match e {
        AllocError::CudaUnavailable { library, reason } => Error::Device {
            op: library,
            message: reason.to_string(),
        },
        AllocError::Nvrtc { program, arch, log } => Error::Device {
            op: "NVRTC compile",
            message: format!("{program} for {arch}: {log}"),
        },
        AllocError::Cuda { what, message } => Error::Device { op: what, message },
        other => Error::Alloc(other),
    }
}

/// A kernel argument, by value.
#[derive(Debug, Clone, Copy)]
enum Arg {
    U64(u64),
    F32(f32),
}

impl CudaKernels {
    /// Kernels on device `ordinal`: checks that the driver and NVRTC can be loaded, opens the
    /// device's primary context and compiles the kernels (once per process and device).
    ///
    /// # Errors
    /// [`Error::Device`] naming `libcuda` or `libnvrtc` when missing (never a panic), a
    /// driver error (no such device), or NVRTC's log.
    pub fn new(ordinal: usize) -> Result<Self> {
        CudaLibrary::require_all(&[CudaLibrary::Driver, CudaLibrary::Nvrtc]).map_err(setup)?;
        let ctx = zero_alloc::context::untracked_context(ordinal).map_err(setup)?;
        let functions = LoadedKernels::for_context(&ctx, &ENGINE_KERNEL_SET).map_err(setup)?;
        let stream = ctx.default_stream();
        let overflow = stream.alloc_zeros::<u32>(1).map_err(driver("cuMemAlloc"))?;
        let overflow_at = ops::device_address(&overflow, &stream);
        Ok(Self {
            ordinal,
            stream,
            functions,
            overflow: Mutex::new(overflow),
            overflow_at,
        })
    }

    /// The device these kernels run on.
    #[must_use]
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// Checks that `arena` lives on this device and binds the context to the thread.
    fn check_arena(&self, kernel: &'static str, arena: &Arena) -> Result<()> {
        if arena.device() != Device::Cuda(self.ordinal) {
            return Err(Error::Device {
                op: kernel,
                message: format!(
                    "CudaKernels on cuda:{} cannot compute on an arena on {}",
                    self.ordinal,
                    arena.device()
                ),
            });
        }
        // An error cudarc recorded earlier is named as such, not as this kernel's.
        zero_alloc::context::bind(self.stream.context()).map_err(|e| setup(AllocError::from(e)))
    }

    /// The device address of `span`'s first element of `elem` bytes, after checking that
    /// the span lies inside its block. The address is valid while the arena is borrowed.
    fn address(&self, arena: &Arena, kernel: &'static str, span: Span, elem: usize) -> Result<u64> {
        let view = arena.device_view(span.block)?;
        let block_elems = view.len() / elem;
        let end = span.start.checked_add(span.len);
        if end.is_none_or(|end| end > block_elems) {
            return Err(Error::BadSpan {
                kernel,
                message: format!(
                    "elements {}..{} of a block of {block_elems}",
                    span.start,
                    span.start.saturating_add(span.len)
                ),
            });
        }
        // Inside the block (checked above), so the offset fits the allocation.
        Ok(view.ptr() + (span.start * elem) as u64)
    }

    /// Launches `name` over `blocks` blocks of `source::BLOCK` threads with `args`.
    ///
    /// Callers pass the arguments of the kernel's parameter list in order and type, and
    /// addresses of spans (checked by [`CudaKernels::address`]) as long as the element
    /// count they pass.
    fn launch(&self, name: &str, blocks: u32, args: &[Arg]) -> Result<()> {
        if blocks == 0 {
            return Ok(());
        }
        let f = self.functions.get(name).ok_or_else(|| Error::Device {
            op: "kernel lookup",
            message: format!("no kernel named {name} in engine.cu"),
        })?;
        let mut builder = self.stream.launch_builder(f);
        for a in args {
            match a {
                Arg::U64(v) => builder.arg(v),
                Arg::F32(v) => builder.arg(v),
            };
        }
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (source::BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: per this function's contract the arguments match the kernel's parameters
        // and every address covers the elements the kernel indexes; the launch is ordered on
        // the arena's stream after every earlier copy or move of those blocks, and the
        // caller holds the arena borrowed, so no block moves or is freed before the kernel
        // is ordered.
        unsafe { builder.launch(cfg) }
            .map(|_| ())
            .map_err(driver("cuLaunchKernel"))
    }
}

/// Checks that element-wise inputs and outputs have one length.
fn same_len(kernel: &'static str, a: Span, b: Span) -> Result<()> {
    if a.len == b.len {
        Ok(())
    } else {
        Err(Error::BadSpan {
            kernel,
            message: format!("ranges of {} and {} elements", a.len, b.len),
        })
    }
}
