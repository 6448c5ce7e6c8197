//! The CUDA backend's causal attention: head permutes and softmax kernels of
//! `kernels/attention.cu` around the cuBLAS batched products of [`super::attention_gemm`].
//!
//! Legend: B batch, T sequence, C channels, NH heads, hs = C/NH.

use super::attention_gemm::{self as ag, AttentionScratch, AttentionShape, Region};
use super::backend::{addr, with_dims, Arg, CudaBackend};
use super::device::DeviceSlice;
use super::geometry as geo;

/// Where the products and kernels of one call work: the shape, the scratch layout and the
/// scratch's device address.
struct Plan {
    shape: AttentionShape,
    layout: AttentionScratch,
    base: u64,
}

impl Plan {
    fn at(&self, region: Region) -> Arg {
        Arg::U64(self.base + 4 * self.layout.offset(region) as u64)
    }
}

impl CudaBackend {
    /// The shape's plan, the scratch grown to its layout; `None` (error recorded) when the
    /// shape is too large or the scratch cannot be allocated.
    fn plan(&self, b: usize, t: usize, c: usize, nh: usize) -> Option<Plan> {
        let plan = AttentionShape::new(b, t, c, nh).and_then(|shape| {
            let layout = AttentionScratch::new(shape)?;
            let base = self.scratch(layout.len)?;
            Ok(Plan {
                shape,
                layout,
                base,
            })
        });
        match plan {
            Ok(p) => Some(p),
            Err(e) => {
                self.record(Err(e));
                None
            }
        }
    }

    /// `attention_split_heads`: dst (W,B,NH,T,hs) from src (B,T,W,NH,hs).
    fn split_heads(&self, dst: Arg, src: Arg, dims: [usize; 5]) {
        let k = "attention_split_heads";
        let [b, t, w, nh, hs] = dims;
        let named = [("b", b), ("t", t), ("w", w), ("nh", nh), ("hs", hs)];
        let args = with_dims(k, vec![dst, src], &named);
        self.launch(k, geo::per_element_of(k, &dims), args);
    }

    /// `attention_merge_heads`: dst (B,T,W,NH,hs) (+)= src (W,B,NH,T,hs).
    fn merge_heads(&self, dst: Arg, src: Arg, dims: [usize; 5], accumulate: bool) {
        let k = "attention_merge_heads";
        let [b, t, w, nh, hs] = dims;
        let named = [("b", b), ("t", t), ("w", w), ("nh", nh), ("hs", hs)];
        let args = with_dims(k, vec![dst, src], &named).map(|mut a| {
            a.push(Arg::U32(u32::from(accumulate)));
            a
        });
        self.launch(k, geo::per_element_of(k, &dims), args);
    }

    fn softmax(&self, k: &'static str, first: Arg, second: Arg, s: AttentionShape) {
        let named = [("b", s.b), ("t", s.t), ("nh", s.nh), ("hs", s.hs)];
        let args = with_dims(k, vec![first, second], &named);
        self.launch(k, geo::attention_softmax_rows(k, s.b, s.nh, s.t), args);
    }

    /// out (B,T,C), att (B,T,NH,T) from qkv (B,T,3C); lengths checked by the caller.
    pub(super) fn attention_forward_gemm(
        &self,
        out: &mut DeviceSlice,
        att: &mut DeviceSlice,
        qkv: &DeviceSlice,
        (b, t, c, nh): (usize, usize, usize, usize),
    ) {
        if b == 0 || t == 0 || c == 0 {
            return; // nothing to compute; cuBLAS rejects leading dimensions of 0
        }
        let Some(p) = self.plan(b, t, c, nh) else {
            return;
        };
        let s = p.shape;
        self.split_heads(p.at(Region::Q), addr(qkv), [b, t, 3, nh, s.hs]);
        self.gemm_batched(&ag::scores(s), &p.layout, p.base);
        let k = "attention_softmax_forward";
        self.softmax(k, addr(att), p.at(Region::Scores), s);
        self.gemm_batched(&ag::weighted_values(s), &p.layout, p.base);
        self.merge_heads(addr(out), p.at(Region::Y), [b, t, 1, nh, s.hs], false);
    }

    /// dqkv (B,T,3C) += the gradient given dout (B,T,C), qkv, att; lengths checked by the
    /// caller.
    pub(super) fn attention_backward_gemm(
        &self,
        dqkv: &mut DeviceSlice,
        dout: &DeviceSlice,
        qkv: &DeviceSlice,
        att: &DeviceSlice,
        (b, t, c, nh): (usize, usize, usize, usize),
    ) {
        if b == 0 || t == 0 || c == 0 {
            return;
        }
        let Some(p) = self.plan(b, t, c, nh) else {
            return;
        };
        let s = p.shape;
        self.split_heads(p.at(Region::Q), addr(qkv), [b, t, 3, nh, s.hs]);
        self.split_heads(p.at(Region::Y), addr(dout), [b, t, 1, nh, s.hs]);
        self.split_heads(p.at(Region::Scores), addr(att), [b, t, 1, nh, t]);
        self.gemm_batched(&ag::d_values(s), &p.layout, p.base);
        self.gemm_batched(&ag::d_weights(s), &p.layout, p.base);
        let k = "attention_softmax_backward";
        self.softmax(k, p.at(Region::Scores), addr(att), s);
        self.gemm_batched(&ag::d_queries(s), &p.layout, p.base);
        self.gemm_batched(&ag::d_keys(s), &p.layout, p.base);
        self.merge_heads(addr(dqkv), p.at(Region::DQ), [b, t, 3, nh, s.hs], true);
    }
}
