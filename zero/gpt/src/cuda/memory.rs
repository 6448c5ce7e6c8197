//! Device memory for the model: [`DeviceBuffer`], an activation buffer in device memory, and
//! the memory operations of [`CudaBackend`]'s [`crate::Backend`] implementation (fill, copy,
//! token upload, mean on the host).
//!
//! Ordering: every operation is queued on the backend's one stream, after the kernels that
//! came before it, so stream order alone sequences them with the kernels. Errors are recorded
//! and returned by the next [`CudaBackend::synchronize`] (or [`crate::Backend::mean`], which
//! synchronises), as for kernel launches.

use std::sync::Arc;

use cudarc::driver::{result, sys, CudaSlice, CudaStream};

use super::backend::{driver_err, CudaBackend};
use super::device::{DeviceIds, DeviceSlice};
use crate::backend::{Backend, CpuBackend};
use crate::{ActivationMemory, Result};

/// `len` f32 elements of device memory with the stream its views are made on.
#[derive(Debug)]
pub struct DeviceBuffer {
    /// `None` for no elements (the driver allocates no zero-byte block).
    mem: Option<CudaSlice<f32>>,
    stream: Arc<CudaStream>,
}

impl DeviceBuffer {
    /// `len` zeroed elements on `stream`'s device.
    ///
    /// # Errors
    /// [`crate::GptError::Cuda`] when the allocation fails.
    pub fn zeros(stream: &Arc<CudaStream>, len: usize) -> Result<Self> {
        let mem = if len == 0 {
            None
        } else {
            Some(
                stream
                    .alloc_zeros::<f32>(len)
                    .map_err(driver_err("cuMemAlloc"))?,
            )
        };
        Ok(Self {
            mem,
            stream: Arc::clone(stream),
        })
    }
}

impl ActivationMemory<DeviceSlice> for DeviceBuffer {
    fn floats(&self) -> &DeviceSlice {
        match &self.mem {
            Some(mem) => DeviceSlice::of(mem, &self.stream),
            None => DeviceSlice::empty(),
        }
    }
    fn floats_mut(&mut self) -> &mut DeviceSlice {
        match &mut self.mem {
            Some(mem) => DeviceSlice::of_mut(mem, &self.stream),
            None => DeviceSlice::empty(),
        }
    }
}

impl CudaBackend {
    /// Makes the backend's context current on the calling thread (the raw driver calls
    /// below act on the current context); a failure is recorded and returns false.
    fn bound(&self) -> bool {
        let r = self.bind_context();
        let ok = r.is_ok();
        self.record(r);
        ok
    }

    /// `dst = src`, host ids to the device. The driver copies pageable `src` to staging
    /// memory before returning, so `src` may be dropped right after.
    pub(super) fn upload(&self, dst: &mut DeviceIds, src: &[u32]) {
        assert_eq!(dst.len(), src.len(), "token ids to upload");
        if src.is_empty() || !self.bound() {
            return;
        }
        // SAFETY: dst is a view of src.len() live device u32s (asserted), unique by its
        // `&mut`; the copy is queued on self.stream after every earlier use of dst.
        let r = unsafe { result::memcpy_htod_async(dst.addr(), src, self.stream().cu_stream()) };
        self.record(r.map_err(driver_err("cuMemcpyHtoDAsync")));
    }

    /// `out[i] = value`, as a 32-bit pattern.
    pub(super) fn memset(&self, out: &mut DeviceSlice, value: f32) {
        if out.is_empty() || !self.bound() {
            return;
        }
        let stream = self.stream().cu_stream();
        // SAFETY: out is a view of out.len() live 4-byte device elements, unique by its
        // `&mut`; the memset is queued on self.stream.
        let r = unsafe { sys::cuMemsetD32Async(out.addr(), value.to_bits(), out.len(), stream) };
        self.record(r.result().map_err(driver_err("cuMemsetD32Async")));
    }

    /// `dst = src` on the device.
    pub(super) fn copy_on_device(&self, dst: &mut DeviceSlice, src: &DeviceSlice) {
        assert_eq!(dst.len(), src.len(), "device copy");
        if src.is_empty() || !self.bound() {
            return;
        }
        let bytes = 4 * src.len();
        // SAFETY: both views hold src.len() live f32s (asserted); dst is unique by its `&mut`,
        // so the two do not overlap; the copy is queued on self.stream.
        let r = unsafe {
            result::memcpy_dtod_async(dst.addr(), src.addr(), bytes, self.stream().cu_stream())
        };
        self.record(r.map_err(driver_err("cuMemcpyDtoDAsync")));
    }

    /// The CPU backend's mean of `x` after copying it to the host; synchronises the stream.
    pub(super) fn mean_on_host(&self, x: &DeviceSlice) -> Result<f32> {
        CpuBackend.mean(&self.to_host(x)?)
    }

    /// A host copy of `x`, after every kernel queued so far; synchronises the stream.
    ///
    /// # Errors
    /// A failed copy or an earlier failed launch (see `synchronize`).
    pub fn to_host(&self, x: &DeviceSlice) -> Result<Vec<f32>> {
        let mut host = vec![0f32; x.len()];
        if !host.is_empty() && self.bound() {
            // SAFETY: x is a view of host.len() live device f32s; the copy is queued on
            // self.stream after the kernels that wrote x, and a copy into pageable memory
            // returns only once it is complete.
            let r = unsafe {
                result::memcpy_dtoh_async(&mut host, x.addr(), self.stream().cu_stream())
            };
            self.record(r.map_err(driver_err("cuMemcpyDtoHAsync")));
        }
        self.synchronize()?;
        Ok(host)
    }
}
