//! `CudaOps`: the protocol's operations on one rank's CUDA stream, and the typed front-end
//! over cudarc device buffers. Every rank's stream belongs to the same context, so a device
//! address published by one rank thread is valid in the others. Not yet run on a GPU.

use std::sync::Arc;

use cudarc::driver::{
    result, CudaContext, CudaEvent, CudaFunction, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr,
    LaunchConfig, PushKernelArg,
};
use zero_alloc::nvrtc::{KernelSet, LoadedKernels, Program, BITWISE_OPTIONS};
use zero_alloc::AllocError;

use super::{create_with_ops, DeviceLocalComm, DeviceOps, RawBuf};
use crate::communicator::Collective;
use crate::config::Config;
use crate::dtype::DType;
use crate::element::Element;
use crate::error::{CommError, Result};
use crate::reduce_op::ReduceOp;

/// The reduction kernel's CUDA source (compiled by NVRTC once per process and device).
pub const REDUCE_SOURCE: &str = include_str!("reduce.cu");
/// The kernel entry points of [`REDUCE_SOURCE`], one per element type.
pub const REDUCE_KERNELS: [&str; 3] = [
    "device_local_reduce_f32",
    "device_local_reduce_bf16",
    "device_local_reduce_f16",
];
/// [`REDUCE_SOURCE`] as the NVRTC program zero-alloc compiles (its arithmetic is spelled
/// with rounding intrinsics; the options state the IEEE defaults all the same).
pub const REDUCE_PROGRAM: Program = Program {
    name: "reduce.cu",
    prelude: "",
    text: REDUCE_SOURCE,
    functions: &REDUCE_KERNELS,
    options: BITWISE_OPTIONS,
};
/// The device-local reduction as the kernel set zero-alloc loads (and `zero-cubins` builds ahead).
pub static REDUCE_SET: KernelSet = KernelSet {
    name: "zero-comm device_local",
    programs: &[REDUCE_PROGRAM],
};
/// Most ranks the kernel reads (`DEVICE_LOCAL_MAX_RANKS` in the source).
pub const MAX_RANKS: usize = 16;
const THREADS: u32 = 256;
const MAX_BLOCKS: u64 = 4096;

/// The kernel's `Sources` argument: the ranks' input addresses.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct Sources([u64; MAX_RANKS]);

// SAFETY: `Sources` is `repr(C)` plain data with the layout of the kernel's `struct Sources
// { unsigned long long ptr[16]; }`, passed by value.
unsafe impl DeviceRepr for Sources {}

fn driver(call: &'static str) -> impl Fn(cudarc::driver::DriverError) -> CommError {
    move |e| CommError::Vendor {
        backend: "device_local",
        call,
        name: format!("{e:?}"),
        code: i64::from(e.0 as u32),
    }
}

/// zero-alloc's CUDA setup errors (a missing library, NVRTC's log, a module the driver
/// refused) as `Unavailable`, keeping zero-alloc's message.
fn setup(e: AllocError) -> CommError {
    CommError::Unavailable {
        backend: "device_local",
        why: e.to_string(),
    }
}

/// The three kernels loaded on `ctx`'s device (compiled on first use in the process), in
/// [`REDUCE_KERNELS`]' order.
fn kernels(ctx: &Arc<CudaContext>) -> Result<Arc<[CudaFunction; 3]>> {
    let loaded = LoadedKernels::for_context(ctx, &REDUCE_SET).map_err(setup)?;
    let get = |name| {
        loaded
            .get(name)
            .cloned()
            .ok_or_else(|| CommError::Unavailable {
                backend: "device_local",
                why: format!("reduce.cu has no kernel {name}"),
            })
    };
    Ok(Arc::new([
        get(REDUCE_KERNELS[0])?,
        get(REDUCE_KERNELS[1])?,
        get(REDUCE_KERNELS[2])?,
    ]))
}

/// [`DeviceOps`] on one rank's stream.
#[derive(Debug)]
pub struct CudaOps {
    stream: Arc<CudaStream>,
    kernels: Arc<[CudaFunction; 3]>,
}

impl CudaOps {
    /// The rank's stream.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

/// Creates `n` ranks on `ctx`'s device, each with a new stream. `ctx` must come from
/// `zero_alloc::context::untracked_context`: new streams would turn on cudarc's event
/// tracking in a tracked context, whose events the workspace's views record too early.
///
/// # Errors
/// `InvalidArgument` for 0 or more than [`MAX_RANKS`] ranks or a context with event
/// tracking on; `Unavailable` or `Vendor` when the kernel cannot be compiled or loaded or a
/// stream cannot be created.
pub fn create(
    ctx: &Arc<CudaContext>,
    n: usize,
    config: Config,
) -> Result<Vec<DeviceLocalComm<CudaOps>>> {
    if ctx.is_event_tracking() {
        return Err(CommError::InvalidArgument {
            what: "device_local needs a context from zero_alloc::context::untracked_context".into(),
        });
    }
    if n > MAX_RANKS {
        return Err(CommError::InvalidArgument {
            what: format!("device_local supports at most {MAX_RANKS} ranks, asked for {n}"),
        });
    }
    let kernels = kernels(ctx)?;
    let ops = (0..n)
        .map(|_| {
            let stream = ctx.new_stream().map_err(driver("cuStreamCreate"))?;
            Ok(CudaOps {
                stream,
                kernels: Arc::clone(&kernels),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    create_with_ops(ops, config)
}

impl DeviceOps for CudaOps {
    type Event = CudaEvent;

    unsafe fn copy(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        zero_alloc::context::bind(self.stream.context())
            .map_err(crate::error::bind_error("device_local"))?;
        // SAFETY: forwarded from the caller's contract (S1-S4 of `mod.rs`); the stream is live.
        unsafe { result::memcpy_dtod_async(dst, src, bytes, self.stream.cu_stream()) }
            .map_err(driver("cuMemcpyDtoDAsync"))
    }

    unsafe fn reduce_in_rank_order(
        &self,
        dtype: DType,
        op: ReduceOp,
        dst: u64,
        srcs: &[u64],
        elems: usize,
    ) -> Result<()> {
        if elems == 0 {
            return Ok(());
        }
        // cudarc's launch binds too, but would report an earlier error as the launch's.
        zero_alloc::context::bind(self.stream.context())
            .map_err(crate::error::bind_error("device_local"))?;
        let mut sources = Sources([0; MAX_RANKS]);
        sources
            .0
            .get_mut(..srcs.len())
            .ok_or_else(|| CommError::InvalidArgument {
                what: format!("device_local reads at most {MAX_RANKS} ranks"),
            })?
            .copy_from_slice(srcs);
        let f = &self.kernels[match dtype {
            DType::F32 => 0,
            DType::Bf16 => 1,
            DType::F16 => 2,
            DType::I32 | DType::I64 | DType::F64 => return Err(super::ops::no_reduction(dtype)),
        }];
        let (n_src, elems64) = (srcs.len() as u32, elems as u64);
        let code: i32 = match op {
            ReduceOp::Sum => 0,
            ReduceOp::Avg => 1,
            ReduceOp::Max => 2,
            ReduceOp::Min => 3,
        };
        let blocks = elems64.div_ceil(u64::from(THREADS)).min(MAX_BLOCKS) as u32;
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut launch = self.stream.launch_builder(f);
        launch
            .arg(&dst)
            .arg(&sources)
            .arg(&n_src)
            .arg(&elems64)
            .arg(&code);
        // SAFETY: the arguments match the kernel's parameters in order and type; the
        // addresses are valid for `elems` elements of `dtype` by the caller's contract
        // (S1-S4 of `mod.rs`), and the kernel's grid-stride loop stays below `elems`.
        unsafe { launch.launch(cfg) }
            .map(drop)
            .map_err(driver("cuLaunchKernel"))
    }

    fn record(&self) -> Result<CudaEvent> {
        self.stream
            .record_event(None)
            .map_err(driver("cuEventRecord"))
    }

    fn wait(&self, event: &CudaEvent) -> Result<()> {
        self.stream.wait(event).map_err(driver("cuStreamWaitEvent"))
    }

    fn synchronize(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(driver("cuStreamSynchronize"))
    }
}

impl DeviceLocalComm<CudaOps> {
    /// [`DeviceLocalComm::run_raw`] over cudarc buffers (`send = None`: in place).
    ///
    /// # Errors
    /// As [`DeviceLocalComm::run_raw`].
    pub fn run<T: Element, S: DevicePtr<T>, R: DevicePtrMut<T>>(
        &mut self,
        call: Collective,
        send: Option<&S>,
        recv: &mut R,
    ) -> Result<()> {
        let stream = Arc::clone(&self.ops.stream);
        let (send_len, recv_len) = (send.map(|s| s.len()), recv.len());
        // The context is untracked (`create` checks it), so the guards only lend the
        // addresses: writes queued on other streams are the caller's to order first (O2).
        let (sp, _send_guard) = send.map(|s| s.device_ptr(&stream)).unzip();
        let (rp, _recv_guard) = recv.device_ptr_mut(&stream);
        let send = sp.zip(send_len).map(|(addr, len)| RawBuf { addr, len });
        // SAFETY: the cudarc buffers are borrowed (live, disjoint: one is `&mut`) for the
        // call; later uses on this rank's stream follow the peers' reads (S4), and other
        // streams order after it by zero_alloc::context's O2.
        unsafe {
            self.run_raw(
                call,
                T::DTYPE,
                send,
                RawBuf {
                    addr: rp,
                    len: recv_len,
                },
            )
        }
    }
}
