//! The CUDA backend's reductions over all N rows: `bias_backward` and
//! `layernorm_backward_params` in two stages over a partials scratch ([`super::column_sums`]
//! states the order and the tolerance), and `encoder_backward_wte` over the positions
//! grouped by token when the ids were uploaded ([`super::token_groups`]).
//!
//! Legend: N = B*T rows, C channels, OC output channels, U distinct tokens.
//!
//! Scratch: the partials live in the backend's kernel scratch (`CudaBackend::scratch`,
//! shared with attention), `chunks * max(OC, 2C)` floats with chunks = ceil(N / 64)
//! ([`widest_partials`]: 3,145,728 bytes for GPT-2 124M at B = 16, T = 1024, OC = 4C =
//! 3072). Owned by the backend and kept outside that scratch: the groups of the last
//! [`GROUPS_KEPT`] id uploads, `2 + 2N + 2U` u32 each.

use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};

use cudarc::driver::{sys, CudaSlice, DevicePtrMut};

use super::backend::{addr, driver_err, ids, with_dims, Arg, CudaBackend};
use super::device::{DeviceIds, DeviceSlice};
use super::geometry::{self as geo, ColumnReduce, COLUMN_CHUNK_ROWS};
use super::token_groups::{TokenGroups, WordLayout};
use crate::Result;

/// Id uploads whose groups are kept (a model uploads tokens and targets per micro-batch).
pub const GROUPS_KEPT: usize = 4;

/// An upload's groups on the device, keyed by the ids' address and length.
#[derive(Debug)]
struct UploadedGroups {
    ids_addr: u64,
    n: usize,
    layout: WordLayout,
    words: CudaSlice<u32>,
}

/// The token groups the reductions keep on the device (see the module comment).
#[derive(Debug, Default)]
pub(super) struct ReductionScratch {
    groups: Mutex<VecDeque<UploadedGroups>>,
}

/// f32 partials the widest column reductions of a GPT-2 pass over `n` rows of `c` channels
/// need: the fc bias's (4C columns, one quantity) and LayerNorm's parameters' (C columns,
/// two quantities), by the geometry [`CudaBackend::bias_backward`] and
/// [`CudaBackend::layernorm_backward_params`] launch with.
///
/// # Errors
/// [`crate::GptError::LaunchTooLarge`] when a reduction's geometry overflows.
pub(super) fn widest_partials(n: usize, c: usize) -> Result<usize> {
    let fc = geo::checked_product("bias_backward_partials", "4C", &[4, c])?;
    let bias = partials_len("bias_backward_partials", n, fc, 1)?;
    let layernorm = partials_len("layernorm_backward_params_partials", n, c, 2)?;
    Ok(bias.max(layernorm))
}

/// f32 partials of a column reduction of (rows, cols) computing `quantities` sums per
/// column.
fn partials_len(
    kernel: &'static str,
    rows: usize,
    cols: usize,
    quantities: usize,
) -> Result<usize> {
    let plan = geo::column_reduce(kernel, rows, cols)?;
    geo::checked_product(kernel, "partials", &[quantities, plan.partials_len])
}

impl CudaBackend {
    /// The launches of a column reduction of (rows, cols) computing `quantities` sums per
    /// column, and the address of `quantities * chunks * cols` partials in the backend's
    /// scratch; None when there is nothing to reduce.
    fn plan_with_partials(
        &self,
        kernel: &'static str,
        rows: usize,
        cols: usize,
        quantities: usize,
    ) -> Result<Option<(ColumnReduce, Arg)>> {
        let plan = geo::column_reduce(kernel, rows, cols)?;
        if plan.partials.is_empty() {
            return Ok(None);
        }
        let len = partials_len(kernel, rows, cols, quantities)?;
        Ok(Some((plan, Arg::U64(self.scratch(len)?))))
    }

    /// Groups `src` (just uploaded into `dst`) by token and uploads the groups, replacing
    /// those of an earlier upload to the same ids.
    pub(super) fn remember_groups(&self, dst: &DeviceIds, src: &[u32]) {
        let result = TokenGroups::of(src).and_then(|g| {
            let words = self.stream().clone_htod(&g.words());
            Ok(UploadedGroups {
                ids_addr: dst.addr(),
                n: src.len(),
                layout: g.layout(),
                words: words.map_err(driver_err("cuMemcpyHtoDAsync"))?,
            })
        });
        let mut kept = self
            .reductions
            .groups
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // An earlier upload's groups go even when these failed (the device check would
        // reject them anyway).
        kept.retain(|k| k.ids_addr != dst.addr());
        match result {
            Ok(up) => {
                if kept.len() == GROUPS_KEPT {
                    kept.pop_front();
                }
                kept.push_back(up);
            }
            Err(e) => self.record(Err(e)),
        }
    }

    /// dbias (OC,) += column sums of dout (N,OC), in two stages.
    pub(super) fn bias_backward(
        &self,
        dbias: &mut DeviceSlice,
        dout: &DeviceSlice,
        n: usize,
        oc: usize,
    ) {
        let (k1, k2) = ("bias_backward_partials", "bias_backward_finish");
        let (plan, partials) = match self.plan_with_partials(k1, n, oc, 1) {
            Ok(Some(p)) => p,
            Ok(None) => return,
            Err(e) => return self.record(Err(e)),
        };
        let dims = [("n", n), ("oc", oc), ("chunk_rows", COLUMN_CHUNK_ROWS)];
        self.launch(
            k1,
            Ok(plan.partials),
            with_dims(k1, vec![partials, addr(dout)], &dims),
        );
        let dims = [("chunks", plan.chunks), ("oc", oc)];
        self.launch(
            k2,
            Ok(plan.finish),
            with_dims(k2, vec![addr(dbias), partials], &dims),
        );
    }

    /// dweight, dbias (C,) += the column sums of LayerNorm's parameter terms, in two stages.
    pub(super) fn layernorm_backward_params(
        &self,
        dweight: &mut DeviceSlice,
        dbias: &mut DeviceSlice,
        rows: [&DeviceSlice; 4], // dout (N,C), inp (N,C), mean (N,), rstd (N,)
        n: usize,
        c: usize,
    ) {
        let k1 = "layernorm_backward_params_partials";
        let k2 = "layernorm_backward_params_finish";
        // (2, chunks, C): dweight's partials, then dbias's.
        let (plan, partials) = match self.plan_with_partials(k1, n, c, 2) {
            Ok(Some(p)) => p,
            Ok(None) => return,
            Err(e) => return self.record(Err(e)),
        };
        let mut args = vec![partials];
        args.extend(rows.iter().map(|r| addr(r)));
        let dims = [("n", n), ("c", c), ("chunk_rows", COLUMN_CHUNK_ROWS)];
        self.launch(k1, Ok(plan.partials), with_dims(k1, args, &dims));
        let args = vec![addr(dweight), addr(dbias), partials];
        let dims = [("chunks", plan.chunks), ("c", c)];
        self.launch(k2, Ok(plan.finish), with_dims(k2, args, &dims));
    }

    /// dwte (Vp,C)[tokens[row]] += dout (N,C)[row]: grouped by token when `tokens` were
    /// uploaded by `upload_ids` (checked on the device), else one thread per channel.
    pub(super) fn encoder_backward_wte(
        &self,
        dwte: &mut DeviceSlice,
        dout: &DeviceSlice,
        tokens: &DeviceIds,
        n: usize,
        c: usize,
    ) {
        let k = "encoder_backward_wte";
        let fallback = |flag: u64| {
            let args = vec![addr(dwte), addr(dout), ids(tokens), Arg::U64(flag)];
            self.launch(
                k,
                geo::per_element(k, c),
                with_dims(k, args, &[("n", n), ("c", c)]),
            );
        };
        let mut kept = self
            .reductions
            .groups
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let Some(up) = kept
            .iter_mut()
            .find(|u| u.ids_addr == tokens.addr() && u.n == n)
        else {
            return fallback(0);
        };
        let layout = up.layout;
        let words = up.words.device_ptr_mut(self.stream()).0;
        // SAFETY: `words` is a live device allocation of layout.len() >= 1 u32s owned by
        // `kept`, whose lock is held until the launches below are queued; the memset is
        // queued on the stream before them.
        let r = unsafe { sys::cuMemsetD32Async(words, 0, 1, self.stream().cu_stream()) };
        self.record(r.result().map_err(driver_err("cuMemsetD32Async")));
        let k1 = "encoder_backward_wte_check";
        let args = vec![Arg::U64(words), ids(tokens)];
        self.launch(
            k1,
            geo::per_element(k1, n),
            with_dims(k1, args, &[("n", n)]),
        );
        let k2 = "encoder_backward_wte_grouped";
        let args = vec![addr(dwte), addr(dout), Arg::U64(words)];
        let dims = [("n", n), ("groups", layout.groups), ("c", c)];
        self.launch(
            k2,
            geo::block_per_group(k2, layout.groups),
            with_dims(k2, args, &dims),
        );
        fallback(words + (WordLayout::FLAG * 4) as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::widest_partials;

    #[test]
    fn the_widest_partials_are_the_fc_bias() {
        // ceil(N/64) chunks of 4C columns (LayerNorm's 2 x C is narrower): 3,145,728 bytes
        // at GPT-2 124M, B = 16, T = 1024.
        assert_eq!(4 * widest_partials(16 * 1024, 768).unwrap(), 3_145_728);
        assert_eq!(widest_partials(65, 8).unwrap(), 2 * 32);
        assert_eq!(widest_partials(0, 8).unwrap(), 0);
    }
}
