//! Causal attention as cuBLAS strided-batched products over the (batch row, head) pairs, with
//! the backend's scratch layout: pure data, tested on the CPU.
//!
//! Legend: B batch, T sequence, C channels, NH heads, hs = C/NH.
//!
//! The CUDA backend permutes q, k, v out of qkv (B,T,3,NH,hs) into (B,NH,T,hs) each, so every
//! (b, h) pair's q, k, v are contiguous row-major (T,hs) matrices, one fixed stride apart. As
//! in [`super::gemm`], a row-major product X = A·B is computed column-major as Xᵀ = Bᵀ·Aᵀ.
//! The scale 1/sqrt(hs) is applied by the softmax kernels, not by alpha, as the CPU kernel
//! scales the dot product.
//!
//! The caller's att (B,T,NH,T) is read and written in place. Within one batch row b, head h's
//! (T,T) matrix starts at b*T*NH*T + h*T with rows NH*T apart: one call of batch NH (ld NH*T,
//! stride T) covers the row. Across batch rows the pairs are T*NH*T apart, not NH*T, so no
//! single stride covers all B*NH pairs: a step that touches att is B calls of batch NH. The
//! backward's d(att) and d(score) live in the scratch's (B,NH,T,T) region, one call of batch
//! B*NH each.

use super::geometry::checked_product;
use crate::{GptError, Result};

const KERNEL: &str = "cublasGemmStridedBatchedEx";

/// A region of the attention scratch ([`AttentionScratch`]) a batched product reads or
/// writes. Each holds B*NH matrices, (T,hs) or (T,T), row-major, one after the other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Region {
    /// Queries (B,NH,T,hs).
    Q,
    /// Keys (B,NH,T,hs).
    K,
    /// Values (B,NH,T,hs).
    V,
    /// The output before the heads are merged (forward), or `dout` split into heads
    /// (backward): (B,NH,T,hs).
    Y,
    /// d(att), then d(score), in the backward: (B,NH,T,T). The forward does not use it.
    Scores,
    /// Gradients of Q, K, V: (B,NH,T,hs) each.
    DQ,
    /// See [`Region::DQ`].
    DK,
    /// See [`Region::DQ`].
    DV,
}

/// The shape of one attention call, every dimension checked to fit cuBLAS's `int`. Made
/// only by [`AttentionShape::new`], so the products below never see an unchecked shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionShape {
    /// Batch B.
    pub(super) b: usize,
    /// Sequence T.
    pub(super) t: usize,
    /// Heads NH.
    pub(super) nh: usize,
    /// Head size hs = C/NH.
    pub(super) hs: usize,
}

fn int(what: &'static str, value: usize) -> Result<i32> {
    i32::try_from(value).map_err(|_| GptError::LaunchTooLarge {
        kernel: KERNEL,
        what,
        value,
        limit: i32::MAX as usize,
    })
}

impl AttentionShape {
    /// Checks that T, hs, the batch count B*NH, each per-pair matrix (T*T, T*hs) and att's row
    /// stride NH*T fit an `int`, and that the whole scratch and att (B*NH*T*T, the size of the
    /// scores region) fit a usize (strides are 64-bit in cuBLAS).
    ///
    /// # Errors
    /// [`GptError::LaunchTooLarge`] naming the first dimension that does not fit.
    ///
    /// # Panics
    /// When `nh` is 0 or does not divide `c` (the CPU kernel's contract).
    pub fn new(b: usize, t: usize, c: usize, nh: usize) -> Result<Self> {
        assert!(
            nh > 0 && c % nh == 0,
            "c = {c} is not a multiple of nh = {nh}"
        );
        let shape = Self {
            b,
            t,
            nh,
            hs: c / nh,
        };
        int("T", t)?;
        int("hs", shape.hs)?;
        int("B*NH", checked_product(KERNEL, "B*NH", &[b, nh])?)?;
        int("T*T", checked_product(KERNEL, "T*T", &[t, t])?)?;
        int("T*hs", checked_product(KERNEL, "T*hs", &[t, shape.hs])?)?;
        int("NH*T", checked_product(KERNEL, "NH*T", &[nh, t])?)?;
        AttentionScratch::new(shape)?;
        Ok(shape)
    }
}

/// Offsets (in f32 elements) of each [`Region`] in the backend's attention scratch, and its
/// length: 7 (B,NH,T,hs) regions and one (B,NH,T,T), i.e. 7*B*T*C + B*NH*T*T floats.
/// Q, K, V are adjacent (one permute writes all three), and so are DQ, DK, DV.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionScratch {
    /// Elements of one (B,NH,T,hs) region (B*T*C).
    pub heads: usize,
    /// Elements in all.
    pub len: usize,
}

impl AttentionScratch {
    /// The layout for `shape`.
    ///
    /// # Errors
    /// [`GptError::LaunchTooLarge`] when the length overflows a usize.
    pub fn new(shape: AttentionShape) -> Result<Self> {
        let AttentionShape { b, t, nh, hs } = shape;
        let heads = checked_product(KERNEL, "B*T*C", &[b, nh, t, hs])?;
        let scores = checked_product(KERNEL, "B*NH*T*T", &[b, nh, t, t])?;
        let len = heads
            .checked_mul(7)
            .and_then(|h| h.checked_add(scores))
            .ok_or(GptError::LaunchTooLarge {
                kernel: KERNEL,
                what: "attention scratch elements",
                value: usize::MAX,
                limit: usize::MAX,
            })?;
        Ok(Self { heads, len })
    }

    /// Where `region` starts.
    #[must_use]
    pub fn offset(&self, region: Region) -> usize {
        let slot = match region {
            Region::Q => 0,
            Region::K => 1,
            Region::V => 2,
            Region::Y => 3,
            Region::DQ => 4,
            Region::DK => 5,
            Region::DV => 6,
            Region::Scores => 7,
        };
        slot * self.heads
    }
}

#[path = "attention_gemm_steps.rs"]
mod steps;
pub use steps::{
    d_keys, d_queries, d_values, d_weights, scores, weighted_values, BatchedCall, Buffer, Place,
};

#[cfg(test)]
#[path = "attention_gemm_naive.rs"]
mod naive;
#[cfg(test)]
#[path = "attention_gemm_tests.rs"]
mod tests;
