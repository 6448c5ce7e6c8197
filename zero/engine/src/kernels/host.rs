//! [`Kernels`] on host arenas: loops over arena views, the reference for every other
//! implementation.

use std::sync::atomic::{AtomicBool, Ordering};

use zero_alloc::Arena;
use zero_comm::{DType, F32Element};

mod adamw;

use adamw::adamw_host;

use super::split::{each_mut, zip_mut, zip_mut_any};
use super::{part, part_mut};

use super::{AdamWBuffers, AdamWStep, Kernels, Span};
use crate::error::{Error, Result};
use crate::precision::{accumulate, narrow, widen, with_dtype};

/// The engine's passes as host loops over arena views.
#[derive(Debug, Default)]
pub struct HostKernels {
    /// Whether an `accumulate` saw an inf or NaN since the last `take_overflow`.
    overflow: AtomicBool,
}

impl Kernels for HostKernels {
    fn name(&self) -> &'static str {
        "host"
    }

    fn fill_zero(&self, arena: &mut Arena, dtype: DType, dst: Span) -> Result<()> {
        with_dtype!(dtype, S => {
            let dst = part_mut("fill_zero", arena.slice_mut::<S>(dst.block)?, dst)?;
            each_mut(dst, |d| d.fill(S::default()));
        });
        Ok(())
    }

    fn copy(&self, arena: &mut Arena, dtype: DType, src: Span, dst: Span) -> Result<()> {
        same_len("copy", src, dst)?;
        with_dtype!(dtype, S => {
            let mut views = arena.views();
            let from = part("copy", views.get::<S>(src.block)?, src)?;
            let to = part_mut("copy", views.get_mut::<S>(dst.block)?, dst)?;
            zip_mut(to, from, <[S]>::copy_from_slice);
        });
        Ok(())
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
        with_dtype!(dtype, S => {
            let mut views = arena.views();
            let from = part("widen", views.get::<S>(src.block)?, src)?;
            let to = part_mut("widen", views.get_mut::<f32>(dst.block)?, dst)?;
            zip_mut(to, from, |d, s| widen(s, d, factor));
        });
        Ok(())
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
        with_dtype!(dtype, S => {
            let mut views = arena.views();
            let from = part("narrow", views.get::<f32>(src.block)?, src)?;
            let to = part_mut("narrow", views.get_mut::<S>(dst.block)?, dst)?;
            zip_mut(to, from, |d, s| narrow(s, d, factor));
        });
        Ok(())
    }

    fn accumulate(&self, arena: &mut Arena, dtype: DType, acc: Span, x: Span) -> Result<()> {
        same_len("accumulate", acc, x)?;
        let overflow = with_dtype!(dtype, S => {
            let mut views = arena.views();
            let piece = part("accumulate", views.get::<S>(x.block)?, x)?;
            let acc = part_mut("accumulate", views.get_mut::<S>(acc.block)?, acc)?;
            zip_mut_any(acc, piece, accumulate)
        });
        if overflow {
            self.overflow.store(true, Ordering::Relaxed);
        }
        Ok(())
    }

    fn take_overflow(&self, _arena: &mut Arena) -> Result<bool> {
        Ok(self.overflow.swap(false, Ordering::Relaxed))
    }

    fn add_squares(
        &self,
        arena: &mut Arena,
        dtype: DType,
        src: Span,
        factor: f32,
        mut sum: f64,
    ) -> Result<f64> {
        with_dtype!(dtype, S => {
            for &x in part("add_squares", arena.slice::<S>(src.block)?, src)? {
                let x = f64::from(x.to_f32() * factor);
                sum += x * x;
            }
        });
        Ok(sum)
    }

    fn adamw(
        &self,
        arena: &mut Arena,
        dtype: DType,
        bufs: &AdamWBuffers,
        step: &AdamWStep<'_>,
    ) -> Result<()> {
        for other in [bufs.scratch, bufs.params, bufs.m, bufs.v]
            .into_iter()
            .chain(bufs.master)
        {
            same_len("adamw", bufs.grads, other)?;
        }
        with_dtype!(dtype, S => adamw_host::<S>(arena, bufs, step))
    }
}

impl HostKernels {
    /// `accumulate` with the addend in another arena: `acc` of `arena` += `x` of `from`,
    /// flagging an inf or NaN as `accumulate` does (the gradient offload's landing,
    /// `grad_home`).
    ///
    /// # Errors
    /// Spans of different lengths or outside their blocks, an arena without host memory.
    pub(crate) fn accumulate_across(
        &self,
        (arena, acc): (&mut Arena, Span),
        (from, x): (&Arena, Span),
        dtype: DType,
    ) -> Result<()> {
        same_len("accumulate", acc, x)?;
        let overflow = with_dtype!(dtype, S => {
            let piece = part("accumulate", from.slice::<S>(x.block)?, x)?;
            let acc = part_mut("accumulate", arena.slice_mut::<S>(acc.block)?, acc)?;
            zip_mut_any(acc, piece, accumulate)
        });
        if overflow {
            self.overflow.store(true, Ordering::Relaxed);
        }
        Ok(())
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
