//! [`Kernels`] for [`CudaKernels`]: each method checks its spans, resolves their device
//! addresses and enqueues one copy, fill or launch per pass on the arena's stream.

use std::ops::Range;
use std::sync::PoisonError;

use cudarc::driver::result as cu;
use zero_alloc::Arena;
use zero_comm::DType;

use super::source::{grid, typed, MAX_BLOCKS, MAX_SUM_BLOCKS};
use super::{driver, same_len, Arg, CudaKernels};
use crate::error::{Error, Result};
use crate::kernels::{AdamWBuffers, AdamWStep, Kernels, Span};
use crate::optim::DecaySegment;

/// `len` elements as the kernels' `u64 n`.
fn count(len: usize) -> Arg {
    Arg::U64(len as u64)
}

impl Kernels for CudaKernels {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn fill_zero(&self, arena: &mut Arena, dtype: DType, dst: Span) -> Result<()> {
        self.check_arena("fill_zero", arena)?;
        let at = self.address(arena, "fill_zero", dst, dtype.size())?;
        if dst.len == 0 {
            return Ok(());
        }
        // SAFETY: `at` and the span's bytes lie inside the block (checked by `address`); the
        // fill is ordered on the arena's stream.
        unsafe { cu::memset_d8_async(at, 0, dst.len * dtype.size(), self.stream.cu_stream()) }
            .map_err(driver("cuMemsetD8Async"))
    }

    fn copy(&self, arena: &mut Arena, dtype: DType, src: Span, dst: Span) -> Result<()> {
        same_len("copy", src, dst)?;
        self.check_arena("copy", arena)?;
        let from = self.address(arena, "copy", src, dtype.size())?;
        let to = self.address(arena, "copy", dst, dtype.size())?;
        if src.len == 0 {
            return Ok(());
        }
        // SAFETY: both ranges lie inside their blocks (checked), in distinct blocks per the
        // trait's contract, so they do not overlap; ordered on the arena's stream.
        unsafe { cu::memcpy_dtod_async(to, from, src.len * dtype.size(), self.stream.cu_stream()) }
            .map_err(driver("cuMemcpyDtoDAsync"))
    }

    fn widen(
        &self,
        arena: &mut Arena,
        dtype: DType,
        src: Span,
        dst: Span,
        factor: f32,
    ) -> Result<()> {
        same_len("widen", src, dst)?;
        self.check_arena("widen", arena)?;
        let from = self.address(arena, "widen", src, dtype.size())?;
        let to = self.address(arena, "widen", dst, 4)?;
        let args = [
            Arg::U64(to),
            Arg::U64(from),
            count(src.len),
            Arg::F32(factor),
        ];
        self.launch(&typed("widen", dtype), grid(src.len, MAX_BLOCKS), &args)
    }

    fn narrow(
        &self,
        arena: &mut Arena,
        dtype: DType,
        src: Span,
        dst: Span,
        factor: f32,
    ) -> Result<()> {
        same_len("narrow", src, dst)?;
        self.check_arena("narrow", arena)?;
        let from = self.address(arena, "narrow", src, 4)?;
        let to = self.address(arena, "narrow", dst, dtype.size())?;
        let args = [
            Arg::U64(to),
            Arg::U64(from),
            count(src.len),
            Arg::F32(factor),
        ];
        self.launch(&typed("narrow", dtype), grid(src.len, MAX_BLOCKS), &args)
    }

    fn accumulate(&self, arena: &mut Arena, dtype: DType, acc: Span, x: Span) -> Result<()> {
        same_len("accumulate", acc, x)?;
        self.check_arena("accumulate", arena)?;
        let to = self.address(arena, "accumulate", acc, dtype.size())?;
        let from = self.address(arena, "accumulate", x, dtype.size())?;
        // The kernel only ever writes 1 into the note, so launches need no order among them.
        let args = [
            Arg::U64(to),
            Arg::U64(from),
            Arg::U64(self.overflow_at),
            count(x.len),
        ];
        self.launch(&typed("accumulate", dtype), grid(x.len, MAX_BLOCKS), &args)
    }

    fn take_overflow(&self, arena: &mut Arena) -> Result<bool> {
        self.check_arena("take_overflow", arena)?;
        let mut note = self.overflow.lock().unwrap_or_else(PoisonError::into_inner);
        let host = self.read_back(&note)?;
        // Ordered after the read above on the same stream, before any later accumulate.
        self.stream
            .memset_zeros(&mut *note)
            .map_err(driver("cuMemsetD8Async"))?;
        Ok(host.first().is_some_and(|&f| f != 0))
    }

    fn add_squares(
        &self,
        arena: &mut Arena,
        dtype: DType,
        src: Span,
        factor: f32,
        sum: f64,
    ) -> Result<f64> {
        self.check_arena("add_squares", arena)?;
        let from = self.address(arena, "add_squares", src, dtype.size())?;
        let blocks = grid(src.len, MAX_SUM_BLOCKS);
        if blocks == 0 {
            return Ok(sum);
        }
        let partials = self
            .stream
            .alloc_zeros::<f64>(blocks as usize)
            .map_err(driver("cuMemAlloc"))?;
        let out = device_address(&partials, &self.stream);
        let args = [
            Arg::U64(out),
            Arg::U64(from),
            count(src.len),
            Arg::F32(factor),
        ];
        self.launch(&typed("add_squares_partial", dtype), blocks, &args)?;
        Ok(self
            .read_back(&partials)?
            .iter()
            .fold(sum, |acc, &p| acc + p))
    }

    fn adamw(
        &self,
        arena: &mut Arena,
        dtype: DType,
        bufs: &AdamWBuffers,
        step: &AdamWStep<'_>,
    ) -> Result<()> {
        const K: &str = "adamw";
        for other in [bufs.scratch, bufs.params, bufs.m, bufs.v]
            .into_iter()
            .chain(bufs.master)
        {
            same_len(K, bufs.grads, other)?;
        }
        self.check_arena(K, arena)?;
        let c = step.adam.step_constants(step.t, step.lr, step.segments)?;
        let n = bufs.grads.len;
        let grads = self.address(arena, K, bufs.grads, dtype.size())?;
        let scratch = self.address(arena, K, bufs.scratch, 4)?;
        let params = self.address(arena, K, bufs.params, dtype.size())?;
        let (m, v) = (
            self.address(arena, K, bufs.m, 4)?,
            self.address(arena, K, bufs.v, 4)?,
        );
        let weights = match (bufs.master, dtype) {
            (Some(master), _) => self.address(arena, K, master, 4)?,
            (None, DType::F32) => params,
            (None, _) => {
                return Err(Error::BadSpan {
                    kernel: K,
                    message: format!("{dtype:?} parameters need an f32 master copy"),
                })
            }
        };
        let scale = [
            Arg::U64(scratch),
            Arg::U64(grads),
            count(n),
            Arg::F32(step.grad_factor),
            Arg::F32(step.clip_coef),
        ];
        self.launch(&typed("adamw_scale", dtype), grid(n, MAX_BLOCKS), &scale)?;
        for (local, decays) in owned_segments(step.offset, n, step.segments) {
            let (lo, hi) = (local.start, local.end);
            // Byte offset of the segment's first owned element in every f32 buffer.
            let at = (lo * 4) as u64;
            let decay = if decays { c.decay_factor } else { 1.0 };
            let args = [weights + at, m + at, v + at, scratch + at]
                .map(Arg::U64)
                .into_iter()
                .chain([count(hi - lo)])
                .chain(
                    [step.adam.beta1, step.adam.beta2, step.adam.eps]
                        .into_iter()
                        .chain([c.step_size, c.inv_sqrt_bc2, decay])
                        .map(Arg::F32),
                )
                .collect::<Vec<_>>();
            self.launch("adamw_update", grid(hi - lo, MAX_BLOCKS), &args)?;
        }
        if bufs.master.is_some() {
            let args = [Arg::U64(params), Arg::U64(weights), count(n), Arg::F32(1.0)];
            self.launch(&typed("narrow", dtype), grid(n, MAX_BLOCKS), &args)?;
        }
        Ok(())
    }
}

/// The parts of `segments` (unit coordinates) that fall in the `n` elements owned from
/// `offset`, in shard coordinates, with their decay flag; empty intersections left out.
fn owned_segments(
    offset: usize,
    n: usize,
    segments: &[DecaySegment],
) -> impl Iterator<Item = (Range<usize>, bool)> + '_ {
    let end = offset.saturating_add(n);
    segments.iter().filter_map(move |s| {
        let lo = s.range.start.max(offset);
        let hi = s.range.end.min(end);
        (lo < hi).then(|| (lo - offset..hi - offset, s.decay))
    })
}

/// The device address of a scratch allocation made on `stream`.
pub(super) fn device_address<T>(
    buf: &cudarc::driver::CudaSlice<T>,
    stream: &std::sync::Arc<cudarc::driver::CudaStream>,
) -> u64 {
    use cudarc::driver::DevicePtr;
    buf.device_ptr(stream).0
}

impl CudaKernels {
    /// Copies a scratch result to the host after every kernel enqueued before it.
    fn read_back<T: cudarc::driver::DeviceRepr>(
        &self,
        buf: &cudarc::driver::CudaSlice<T>,
    ) -> Result<Vec<T>> {
        let host = self
            .stream
            .clone_dtoh(buf)
            .map_err(driver("cuMemcpyDtoH"))?;
        self.stream
            .synchronize()
            .map_err(driver("cuStreamSynchronize"))?;
        Ok(host)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Per element: the decay flag of the segment holding unit element `offset + i`, if any.
    fn naive(offset: usize, n: usize, segments: &[DecaySegment]) -> Vec<Option<bool>> {
        (offset..offset + n)
            .map(|u| {
                segments
                    .iter()
                    .find(|s| s.range.contains(&u))
                    .map(|s| s.decay)
            })
            .collect()
    }

    #[test]
    fn owned_segments_cover_exactly_the_owned_elements_of_each_segment() {
        let seg = |range: Range<usize>, decay| DecaySegment { range, decay };
        let segments = [
            seg(0..10, true),
            seg(10..25, false),
            seg(30..31, true),
            seg(40..90, true),
        ];
        for offset in [0, 5, 10, 24, 29, 31, 60, 95] {
            for n in [0, 1, 6, 20, 70] {
                let mut got = vec![None; n];
                for (local, decay) in owned_segments(offset, n, &segments) {
                    assert!(local.start < local.end && local.end <= n);
                    for slot in &mut got[local] {
                        assert!(slot.is_none(), "element covered twice");
                        *slot = Some(decay);
                    }
                }
                assert_eq!(got, naive(offset, n, &segments), "offset {offset} n {n}");
            }
        }
    }
}
