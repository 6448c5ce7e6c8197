//! [`CpuBackend`]: the reference kernels of `kernels::*` behind [`Backend`].
//!
//! Legend: B batch, T sequence, C channels, OC output channels, NH heads, N = B*T rows,
//! V vocabulary, Vp padded vocabulary.

// The llm.c signature (outputs, inputs, then every dimension) is the point of the trait.
#![allow(clippy::too_many_arguments)]

use super::Backend;
use crate::activations::Buffer;
use crate::error::Result;
use crate::kernels::{attention, cross_entropy, encoder, gelu, layernorm, matmul, residual};

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

    fn alloc(&self, len: usize) -> Result<Buffer> {
        Ok(Box::new(vec![0f32; len]))
    }
    fn ids(view: &[f32]) -> &[u32] {
        bytemuck::cast_slice(view)
    }
    fn ids_mut(view: &mut [f32]) -> &mut [u32] {
        bytemuck::cast_slice_mut(view)
    }
    fn upload_ids(&self, dst: &mut [u32], src: &[u32]) {
        dst.copy_from_slice(src);
    }
    fn fill(&self, out: &mut [f32], value: f32) {
        out.fill(value);
    }
    fn copy(&self, dst: &mut [f32], src: &[f32]) {
        dst.copy_from_slice(src);
    }
    fn mean(&self, x: &[f32]) -> Result<f32> {
        let sum = x.iter().map(|&v| f64::from(v)).sum::<f64>();
        Ok((sum / x.len() as f64) as f32)
    }

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
    fn matmul_backward_input(
        &self,
        dinp: &mut [f32],
        dout: &[f32],
        weight: &[f32],
        n: usize,
        c: usize,
        oc: usize,
    ) {
        matmul::matmul_backward_input(dinp, dout, weight, n, c, oc);
    }
    fn matmul_backward_weight(
        &self,
        dweight: &mut [f32],
        dbias: Option<&mut [f32]>,
        dout: &[f32],
        inp: &[f32],
        n: usize,
        c: usize,
        oc: usize,
    ) {
        matmul::matmul_backward_weight(dweight, dbias, dout, inp, n, c, oc);
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
