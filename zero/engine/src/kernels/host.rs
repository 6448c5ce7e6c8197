//! [`Kernels`] on host arenas: loops over arena views, the reference for every other
//! implementation.

use std::sync::atomic::{AtomicBool, Ordering};

use zero_alloc::Arena;
use zero_comm::{DType, F32Element};

use super::{part, part_mut};

use super::{AdamWBuffers, AdamWStep, Kernels, Span};
use crate::error::{Error, Result};
use crate::precision::{accumulate, any_non_finite, narrow, widen, with_dtype, Store};

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
            part_mut("fill_zero", arena.slice_mut::<S>(dst.block)?, dst)?.fill(S::default());
        });
        Ok(())
    }

    fn copy(&self, arena: &mut Arena, dtype: DType, src: Span, dst: Span) -> Result<()> {
        same_len("copy", src, dst)?;
        with_dtype!(dtype, S => {
            let mut views = arena.views();
            let from = part("copy", views.get::<S>(src.block)?, src)?;
            part_mut("copy", views.get_mut::<S>(dst.block)?, dst)?.copy_from_slice(from);
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
            widen(from, part_mut("widen", views.get_mut::<f32>(dst.block)?, dst)?, factor);
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
            narrow(from, part_mut("narrow", views.get_mut::<S>(dst.block)?, dst)?, factor);
        });
        Ok(())
    }

    fn accumulate(&self, arena: &mut Arena, dtype: DType, acc: Span, x: Span) -> Result<()> {
        same_len("accumulate", acc, x)?;
        let overflow = with_dtype!(dtype, S => {
            let mut views = arena.views();
            let piece = part("accumulate", views.get::<S>(x.block)?, x)?;
            let overflow = any_non_finite(piece);
            accumulate(part_mut("accumulate", views.get_mut::<S>(acc.block)?, acc)?, piece);
            overflow
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

/// [`Kernels::adamw`] for storage type `S`.
fn adamw_host<S: Store>(arena: &mut Arena, b: &AdamWBuffers, s: &AdamWStep<'_>) -> Result<()> {
    const K: &str = "adamw";
    let mut views = arena.views();
    let g32 = part_mut(K, views.get_mut::<f32>(b.scratch.block)?, b.scratch)?;
    for (w, &x) in g32
        .iter_mut()
        .zip(part(K, views.get::<S>(b.grads.block)?, b.grads)?)
    {
        *w = x.to_f32() * s.grad_factor * s.clip_coef;
    }
    let m = part_mut(K, views.get_mut::<f32>(b.m.block)?, b.m)?;
    let v = part_mut(K, views.get_mut::<f32>(b.v.block)?, b.v)?;
    let stored = part_mut(K, views.get_mut::<S>(b.params.block)?, b.params)?;
    let mut update = |p: &mut [f32]| s.adam.update(p, g32, m, v, s.offset, s.segments, s.t, s.lr);
    match b.master {
        Some(master) => {
            let master = part_mut(K, views.get_mut::<f32>(master.block)?, master)?;
            update(master)?;
            narrow(master, stored, 1.0);
        }
        None => update(bytemuck::cast_slice_mut(stored))?,
    }
    Ok(())
}
