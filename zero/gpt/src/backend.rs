//! The kernel interface the model is written against, and its CPU implementation.
//!
//! Legend: B batch, T sequence, C channels, OC output channels, NH heads, N = B*T rows,
//! V vocabulary, Vp padded vocabulary.
//!
//! Decision: kernels take `&Self::Slice` / `&mut Self::Slice` where `Slice` is an unsized
//! element view: `[f32]` on CPU; on CUDA `cuda::DeviceSlice`, a `#[repr(transparent)]`
//! wrapper over a slice of zero-sized 4-byte slots whose fat pointer carries a device address
//! and length (it spans no host bytes, so it is never read on the host; a `[f32]` holding a
//! device address was rejected because Rust may assume it can read it). `cuda::CudaBackend`
//! (feature `cuda`) holds its stream, cuBLAS handle and NVRTC kernels. Token ids get their own
//! view type (`[u32]` here). Rejected: generic-associated view types with lifetimes
//! (`View<'a>`), which would thread lifetimes through every model signature for no gain on
//! CPU. The model itself is still CPU-only (`Gpt` owns a `CpuBackend` and host activation
//! buffers): running it on a device needs device activation buffers and a device upload of
//! tokens.
//!
//! Every method has the semantics of the CPU kernel it names in `kernels::*`: backward methods
//! accumulate into their gradient outputs.

// The llm.c signature (outputs, inputs, then every dimension) is the point of this trait.
#![allow(clippy::too_many_arguments)]

use super::kernels::{attention, cross_entropy, encoder, gelu, layernorm, matmul, residual};

/// The kernels a GPT-2 forward and backward pass needs.
pub trait Backend {
    /// A view of f32 elements in this backend's memory.
    type Slice: ?Sized;
    /// A view of token ids in this backend's memory.
    type Ids: ?Sized;

    /// `out (B,T,C) = wte[tokens] + wpe[t]`.
    fn encoder_forward(
        &self,
        out: &mut Self::Slice,
        tokens: &Self::Ids,
        wte: &Self::Slice,
        wpe: &Self::Slice,
        b: usize,
        t: usize,
        c: usize,
    );
    /// dwte (Vp,C), dwpe (maxT,C) += scatter of dout (B,T,C).
    fn encoder_backward(
        &self,
        dwte: &mut Self::Slice,
        dwpe: &mut Self::Slice,
        dout: &Self::Slice,
        tokens: &Self::Ids,
        b: usize,
        t: usize,
        c: usize,
    );
    /// out (N,C), mean (N,), rstd (N,) = LayerNorm of inp (N,C) with weight, bias (C,).
    fn layernorm_forward(
        &self,
        out: &mut Self::Slice,
        mean: &mut Self::Slice,
        rstd: &mut Self::Slice,
        inp: &Self::Slice,
        weight: &Self::Slice,
        bias: &Self::Slice,
        n: usize,
        c: usize,
    );
    /// dinp (N,C), dweight, dbias (C,) += LayerNorm backward.
    fn layernorm_backward(
        &self,
        dinp: &mut Self::Slice,
        dweight: &mut Self::Slice,
        dbias: &mut Self::Slice,
        dout: &Self::Slice,
        inp: &Self::Slice,
        weight: &Self::Slice,
        mean: &Self::Slice,
        rstd: &Self::Slice,
        n: usize,
        c: usize,
    );
    /// out (N,OC) = inp (N,C) · weight (OC,C)ᵀ + bias (OC,).
    fn matmul_forward(
        &self,
        out: &mut Self::Slice,
        inp: &Self::Slice,
        weight: &Self::Slice,
        bias: Option<&Self::Slice>,
        n: usize,
        c: usize,
        oc: usize,
    );
    /// dinp (N,C), dweight (OC,C), dbias (OC,) += matmul backward.
    fn matmul_backward(
        &self,
        dinp: &mut Self::Slice,
        dweight: &mut Self::Slice,
        dbias: Option<&mut Self::Slice>,
        dout: &Self::Slice,
        inp: &Self::Slice,
        weight: &Self::Slice,
        n: usize,
        c: usize,
        oc: usize,
    );
    /// out (B,T,C), att (B,T,NH,T) = causal attention over qkv (B,T,3C).
    fn attention_forward(
        &self,
        out: &mut Self::Slice,
        att: &mut Self::Slice,
        qkv: &Self::Slice,
        b: usize,
        t: usize,
        c: usize,
        nh: usize,
    );
    /// dqkv (B,T,3C) += attention backward.
    fn attention_backward(
        &self,
        dqkv: &mut Self::Slice,
        dout: &Self::Slice,
        qkv: &Self::Slice,
        att: &Self::Slice,
        b: usize,
        t: usize,
        c: usize,
        nh: usize,
    );
    /// out = gelu(inp), (N,).
    fn gelu_forward(&self, out: &mut Self::Slice, inp: &Self::Slice);
    /// dinp += gelu'(inp) dout, (N,).
    fn gelu_backward(&self, dinp: &mut Self::Slice, inp: &Self::Slice, dout: &Self::Slice);
    /// out = inp1 + inp2, (N,).
    fn residual_forward(&self, out: &mut Self::Slice, inp1: &Self::Slice, inp2: &Self::Slice);
    /// dinp1 += dout; dinp2 += dout, (N,).
    fn residual_backward(
        &self,
        dinp1: &mut Self::Slice,
        dinp2: &mut Self::Slice,
        dout: &Self::Slice,
    );
    /// losses (N,) = cross-entropy; logits (N,Vp) become probabilities in place.
    fn crossentropy_forward(
        &self,
        losses: &mut Self::Slice,
        logits: &mut Self::Slice,
        targets: &Self::Ids,
        n: usize,
        v: usize,
        vp: usize,
    );
    /// probs (N,Vp) become d(logits) in place, scaled by dlosses (N,).
    fn crossentropy_backward(
        &self,
        probs: &mut Self::Slice,
        dlosses: &Self::Slice,
        targets: &Self::Ids,
        n: usize,
        v: usize,
        vp: usize,
    );
}

/// The CPU backend: the reference kernels of `kernels::*`, threaded with rayon's global pool
/// (size it with `RAYON_NUM_THREADS` or a `rayon::ThreadPool::install` around the calls).
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuBackend;

impl CpuBackend {
    /// Threads the kernels run on (rayon's current pool).
    #[must_use]
    pub fn num_threads() -> usize {
        rayon::current_num_threads()
    }
}

impl Backend for CpuBackend {
    type Slice = [f32];
    type Ids = [u32];

    fn encoder_forward(
        &self,
        out: &mut [f32],
        tokens: &[u32],
        wte: &[f32],
        wpe: &[f32],
        b: usize,
        t: usize,
        c: usize,
    ) {
        encoder::encoder_forward(out, tokens, wte, wpe, b, t, c);
    }
    fn encoder_backward(
        &self,
        dwte: &mut [f32],
        dwpe: &mut [f32],
        dout: &[f32],
        tokens: &[u32],
        b: usize,
        t: usize,
        c: usize,
    ) {
        encoder::encoder_backward(dwte, dwpe, dout, tokens, b, t, c);
    }
    fn layernorm_forward(
        &self,
        out: &mut [f32],
        mean: &mut [f32],
        rstd: &mut [f32],
        inp: &[f32],
        weight: &[f32],
        bias: &[f32],
        n: usize,
        c: usize,
    ) {
        layernorm::layernorm_forward(out, mean, rstd, inp, weight, bias, n, c);
    }
    fn layernorm_backward(
        &self,
        dinp: &mut [f32],
        dweight: &mut [f32],
        dbias: &mut [f32],
        dout: &[f32],
        inp: &[f32],
        weight: &[f32],
        mean: &[f32],
        rstd: &[f32],
        n: usize,
        c: usize,
    ) {
        layernorm::layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, n, c);
    }
    fn matmul_forward(
        &self,
        out: &mut [f32],
        inp: &[f32],
        weight: &[f32],
        bias: Option<&[f32]>,
        n: usize,
        c: usize,
        oc: usize,
    ) {
        matmul::matmul_forward(out, inp, weight, bias, n, c, oc);
    }
    fn matmul_backward(
        &self,
        dinp: &mut [f32],
        dweight: &mut [f32],
        dbias: Option<&mut [f32]>,
        dout: &[f32],
        inp: &[f32],
        weight: &[f32],
        n: usize,
        c: usize,
        oc: usize,
    ) {
        matmul::matmul_backward(dinp, dweight, dbias, dout, inp, weight, n, c, oc);
    }
    fn attention_forward(
        &self,
        out: &mut [f32],
        att: &mut [f32],
        qkv: &[f32],
        b: usize,
        t: usize,
        c: usize,
        nh: usize,
    ) {
        attention::attention_forward(out, att, qkv, b, t, c, nh);
    }
    fn attention_backward(
        &self,
        dqkv: &mut [f32],
        dout: &[f32],
        qkv: &[f32],
        att: &[f32],
        b: usize,
        t: usize,
        c: usize,
        nh: usize,
    ) {
        attention::attention_backward(dqkv, dout, qkv, att, b, t, c, nh);
    }
    fn gelu_forward(&self, out: &mut [f32], inp: &[f32]) {
        gelu::gelu_forward(out, inp);
    }
    fn gelu_backward(&self, dinp: &mut [f32], inp: &[f32], dout: &[f32]) {
        gelu::gelu_backward(dinp, inp, dout);
    }
    fn residual_forward(&self, out: &mut [f32], inp1: &[f32], inp2: &[f32]) {
        residual::residual_forward(out, inp1, inp2);
    }
    fn residual_backward(&self, dinp1: &mut [f32], dinp2: &mut [f32], dout: &[f32]) {
        residual::residual_backward(dinp1, dinp2, dout);
    }
    fn crossentropy_forward(
        &self,
        losses: &mut [f32],
        logits: &mut [f32],
        targets: &[u32],
        n: usize,
        v: usize,
        vp: usize,
    ) {
        cross_entropy::crossentropy_forward(losses, logits, targets, n, v, vp);
    }
    fn crossentropy_backward(
        &self,
        probs: &mut [f32],
        dlosses: &[f32],
        targets: &[u32],
        n: usize,
        v: usize,
        vp: usize,
    ) {
        cross_entropy::crossentropy_backward(probs, dlosses, targets, n, v, vp);
    }
}
