//! [`Kernels::adamw`](crate::Kernels::adamw) on host arenas, range by range.
//!
//! The update reads each gradient through an f32 scratch (`f32(grads) * grad_factor *
//! clip_coef`). Filled range by range right before the update of the same range, the
//! scratch is read back from cache instead of memory, and the ranges run on rayon's pool.
//! Every element's arithmetic is the same whatever range it falls in, so the split changes
//! no bit.

use zero_alloc::Arena;

use super::super::{part, part_mut, AdamWBuffers, AdamWStep};
use crate::error::Result;
use crate::precision::{narrow, Store};

/// Elements per range: the scratch of one range (256 KiB) stays in a core's L2 cache
/// between its fill and the update, and one range is what `AdamW::update` runs unsplit.
const RANGE: usize = 1 << 16;

/// [`Kernels::adamw`](crate::Kernels::adamw) for storage type `S`; the spans' lengths were
/// checked equal.
pub(super) fn adamw_host<S: Store>(
    arena: &mut Arena,
    b: &AdamWBuffers,
    s: &AdamWStep<'_>,
) -> Result<()> {
    const K: &str = "adamw";
    let mut views = arena.views();
    let master = match b.master {
        Some(master) => Some(part_mut(K, views.get_mut::<f32>(master.block)?, master)?),
        None => None,
    };
    let parts = Parts {
        g32: part_mut(K, views.get_mut::<f32>(b.scratch.block)?, b.scratch)?,
        grads: part(K, views.get::<S>(b.grads.block)?, b.grads)?,
        m: part_mut(K, views.get_mut::<f32>(b.m.block)?, b.m)?,
        v: part_mut(K, views.get_mut::<f32>(b.v.block)?, b.v)?,
        stored: part_mut(K, views.get_mut::<S>(b.params.block)?, b.params)?,
        master,
    };
    parts.run(s, 0)
}

/// One range of every buffer of an update.
struct Parts<'a, S> {
    g32: &'a mut [f32],
    grads: &'a [S],
    m: &'a mut [f32],
    v: &'a mut [f32],
    stored: &'a mut [S],
    /// f32 master weights (half precision), or `None` when `stored` is f32 and updated.
    master: Option<&'a mut [f32]>,
}

impl<S: Store> Parts<'_, S> {
    /// Updates these ranges, which start at element `start` of the spans: halves on rayon's
    /// pool down to [`RANGE`] elements.
    fn run(self, s: &AdamWStep<'_>, start: usize) -> Result<()> {
        let len = self.g32.len();
        if len <= RANGE {
            return self.update(s, start);
        }
        let mid = len.div_ceil(2).next_multiple_of(RANGE).min(len);
        let (low, high) = self.split_at(mid);
        let (a, b) = rayon::join(|| low.run(s, start), || high.run(s, start + mid));
        a.and(b)
    }

    /// The ranges before and from `mid`.
    fn split_at(self, mid: usize) -> (Self, Self) {
        let (g32, g32_high) = self.g32.split_at_mut(mid);
        let (grads, grads_high) = self.grads.split_at(mid);
        let (m, m_high) = self.m.split_at_mut(mid);
        let (v, v_high) = self.v.split_at_mut(mid);
        let (stored, stored_high) = self.stored.split_at_mut(mid);
        let (master, master_high) = match self.master {
            Some(master) => {
                let (low, high) = master.split_at_mut(mid);
                (Some(low), Some(high))
            }
            None => (None, None),
        };
        let low = Parts {
            g32,
            grads,
            m,
            v,
            stored,
            master,
        };
        let high = Parts {
            g32: g32_high,
            grads: grads_high,
            m: m_high,
            v: v_high,
            stored: stored_high,
            master: master_high,
        };
        (low, high)
    }

    /// The scratch, then the update of this one range.
    fn update(self, s: &AdamWStep<'_>, start: usize) -> Result<()> {
        for (w, &x) in self.g32.iter_mut().zip(self.grads) {
            *w = x.to_f32() * s.grad_factor * s.clip_coef;
        }
        let (g32, m, v) = (&*self.g32, self.m, self.v);
        let offset = s.offset + start;
        let mut update = |p: &mut [f32]| s.adam.update(p, g32, m, v, offset, s.segments, s.t, s.lr);
        match self.master {
            Some(master) => {
                update(master)?;
                narrow(master, self.stored, 1.0);
            }
            None => update(bytemuck::cast_slice_mut(self.stored))?,
        }
        Ok(())
    }
}
