//! The CUDA backend's causal attention: head permutes and softmax kernels of
//! `kernels/attention.cu` around the cuBLAS batched products of [`super::attention_gemm`].
//!
//! Legend: B batch, T sequence, C channels, NH heads, hs = C/NH.

use super::attention_gemm::{
    self as ag, AttentionScratch, AttentionShape, BatchedCall, Buffer, Place, Region,
};
use super::backend::{addr, with_dims, Arg, CudaBackend};
use super::device::DeviceSlice;
use super::geometry as geo;

/// Where the products and kernels of one call work: the shape, the scratch layout, the
/// scratch's device address and att's.
struct Plan {
    shape: AttentionShape,
    layout: AttentionScratch,
    base: u64,
    att: u64,
}

impl Plan {
    /// The device address of `place` (f32 elements).
    fn address(&self, place: Place) -> u64 {
        let start = match place.buffer {
            Buffer::Scratch(region) => self.base + 4 * self.layout.offset(region) as u64,
            Buffer::Att => self.att,
        };
        start + 4 * place.from as u64
    }
    fn at(&self, region: Region) -> Arg {
        Arg::U64(self.address(Place {
            buffer: Buffer::Scratch(region),
            from: 0,
        }))
    }
}

impl CudaBackend {
    /// The shape's plan over a scratch of its layout's length (`CudaBackend::scratch`: the
    /// provided one, else the backend's own); `None` (error recorded) when the shape is too
    /// large or the scratch cannot be allocated.
    fn plan(&self, att: u64, (b, t, c, nh): (usize, usize, usize, usize)) -> Option<Plan> {
        let plan = AttentionShape::new(b, t, c, nh).and_then(|shape| {
            let layout = AttentionScratch::new(shape)?;
            let base = self.scratch(layout.len)?;
            Ok(Plan {
                shape,
                layout,
                base,
                att,
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

    /// A softmax kernel over the B*T*NH rows, `buffers` its pointer arguments.
    fn softmax(&self, k: &'static str, buffers: Vec<Arg>, s: AttentionShape) {
        let named = [("b", s.b), ("t", s.t), ("nh", s.nh), ("hs", s.hs)];
        let args = with_dims(k, buffers, &named);
        self.launch(k, geo::attention_softmax_rows(k, s.b, s.nh, s.t), args);
    }

    /// Every call of one step of [`ag`], in order.
    fn products(&self, step: &[BatchedCall], p: &Plan) {
        for call in step {
            self.gemm_batched(call, |place| p.address(place));
        }
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
        let Some(p) = self.plan(att.addr(), (b, t, c, nh)) else {
            return;
        };
        let s = p.shape;
        self.split_heads(p.at(Region::Q), addr(qkv), [b, t, 3, nh, s.hs]);
        self.products(&ag::scores(s), &p); // att = q kᵀ
        self.softmax("attention_softmax_forward", vec![addr(att)], s);
        self.products(&ag::weighted_values(s), &p);
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
        let Some(p) = self.plan(att.addr(), (b, t, c, nh)) else {
            return;
        };
        let s = p.shape;
        self.split_heads(p.at(Region::Q), addr(qkv), [b, t, 3, nh, s.hs]);
        self.split_heads(p.at(Region::Y), addr(dout), [b, t, 1, nh, s.hs]);
        self.products(&ag::d_values(s), &p); // att read in place
        self.products(&ag::d_weights(s), &p);
        let k = "attention_softmax_backward";
        self.softmax(k, vec![p.at(Region::Scores), addr(att)], s);
        self.products(&ag::d_queries(s), &p);
        self.products(&ag::d_keys(s), &p);
        self.merge_heads(addr(dqkv), p.at(Region::DQ), [b, t, 3, nh, s.hs], true);
    }
}
