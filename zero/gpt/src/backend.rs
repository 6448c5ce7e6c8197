//! The kernel interface the model is written against, and its CPU implementation.
//!
//! Legend: B batch, T sequence, C channels, OC output channels, NH heads, N = B*T rows,
//! V vocabulary, Vp padded vocabulary.
//!
//! Decision: kernels take `&Self::Slice` / `&mut Self::Slice` where `Slice` is an unsized
//! element view: `[f32]` on CPU; on CUDA `cuda::DeviceSlice`, a `#[repr(transparent)]`
//! wrapper over a slice of zero-sized 4-byte slots whose fat pointer carries a device address
//! and length (it spans no host bytes, so it is never read on the host; a `[f32]` holding a
//! device address was rejected because Rust may assume it can read it). Token ids get their
//! own view type (`[u32]` here, `cuda::DeviceIds` there). Rejected: generic-associated view
//! types with lifetimes (`View<'a>`), which would thread lifetimes through every model
//! signature for no gain on CPU.
//!
//! Views and slicing: both view types implement [`View`] (length, and a split into two
//! disjoint views that reads no element: slice splitting on CPU, address arithmetic on the
//! device), so the model carves parameters, gradients and activations by one size table on
//! every backend. [`crate::Gpt`] is generic over its backend (`Gpt<B = CpuBackend>`): it
//! calls kernels only through this trait, and its activations are [`Buffer`]s of the
//! backend's memory ([`Backend::alloc`] or a caller's allocator). What the model did on the
//! host is a trait method with the CPU semantics: zeroing and filling scratch
//! ([`Backend::fill`]), moving a checkpointed block input ([`Backend::copy`]), uploading
//! tokens and targets once per micro-batch ([`Backend::upload_ids`], into a 4-byte buffer
//! viewed as ids by [`Backend::ids`]), the mean loss ([`Backend::mean`]) and the tied head's
//! two halves of the matrix-product backward. `cuda::CudaBackend` (feature `cuda`) holds its
//! stream, cuBLAS handle and NVRTC kernels.
//!
//! Every kernel has the semantics of the CPU kernel it names in `kernels::*`: backward
//! methods accumulate into their gradient outputs.

// The llm.c signature (outputs, inputs, then every dimension) is the point of this trait.
#![allow(clippy::too_many_arguments)]

mod cpu;

pub use crate::views::View;
pub use cpu::CpuBackend;

use crate::activations::Buffer;
use crate::config::GptConfig;
use crate::error::Result;

/// The kernels a GPT-2 forward and backward pass needs.
pub trait Backend {
    /// A view of f32 elements in this backend's memory.
    type Slice: ?Sized + View;
    /// A view of token ids in this backend's memory.
    type Ids: ?Sized + View;

    /// A buffer of `len` f32 elements of this backend's memory (contents unspecified).
    ///
    /// # Errors
    /// The backend's allocation error.
    fn alloc(&self, len: usize) -> Result<Buffer<Self::Slice>>;
    /// The same 4-byte elements viewed as token ids.
    fn ids(view: &Self::Slice) -> &Self::Ids;
    /// The mutable twin of [`Backend::ids`].
    fn ids_mut(view: &mut Self::Slice) -> &mut Self::Ids;
    /// `dst = src`, host ids into this backend's memory (lengths equal).
    fn upload_ids(&self, dst: &mut Self::Ids, src: &[u32]);
    /// `out[i] = value` for every element.
    fn fill(&self, out: &mut Self::Slice, value: f32);
    /// `dst = src` (lengths equal, views disjoint).
    fn copy(&self, dst: &mut Self::Slice, src: &Self::Slice);
    /// The mean of `x` on the host: an f64 sum in index order divided by the length, rounded
    /// to f32 (the same value to the bit on every run).
    ///
    /// # Errors
    /// A backend that must copy `x` to the host reports a failed copy or an earlier failed
    /// launch; the CPU never fails.
    fn mean(&self, x: &Self::Slice) -> Result<f32>;

    /// f32 elements of scratch this backend's kernels use, beyond their arguments, in one
    /// forward and backward of a (B, T) batch of `config`'s model: 0 unless a backend needs
    /// some (the CPU kernels need none). [`crate::Activations`] takes that much with its
    /// buffers and hands it over ([`Backend::provide_scratch`]), so whoever supplies the
    /// activations' memory supplies and counts the scratch too.
    ///
    /// # Errors
    /// A shape the backend cannot run.
    fn scratch_len(&self, _config: &GptConfig, _b: usize, _t: usize) -> Result<usize> {
        Ok(0)
    }
    /// Hands the backend `scratch` (contents unspecified) to use for its kernels' scratch in
    /// place of memory of its own, from now on; a backend that needs none drops it.
    fn provide_scratch(&self, scratch: Buffer<Self::Slice>) {
        drop(scratch);
    }
    /// Bytes of scratch the backend holds outside what was provided: what it allocated
    /// itself because no scratch, or too small a one, was provided (0 on the CPU).
    fn scratch_outside_bytes(&self) -> u64 {
        0
    }

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
    /// dinp (N,C) += dout (N,OC) · weight (OC,C): the first half of `matmul_backward`.
    fn matmul_backward_input(
        &self,
        dinp: &mut Self::Slice,
        dout: &Self::Slice,
        weight: &Self::Slice,
        n: usize,
        c: usize,
        oc: usize,
    );
    /// dweight (OC,C) += dout (N,OC)ᵀ · inp (N,C), dbias (OC,) += column sums of dout: the
    /// second half of `matmul_backward`.
    fn matmul_backward_weight(
        &self,
        dweight: &mut Self::Slice,
        dbias: Option<&mut Self::Slice>,
        dout: &Self::Slice,
        inp: &Self::Slice,
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
