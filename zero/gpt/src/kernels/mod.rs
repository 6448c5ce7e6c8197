//! CPU reference kernels, llm.c style: `<op>_forward(out, inputs.., dims)` and
//! `<op>_backward(dinputs.., dout, inputs.., dims)`.
//!
//! Legend: B batch, T sequence, C channels, OC output channels, NH heads, hs = C/NH,
//! N = B*T rows, V vocabulary, Vp padded vocabulary.
//!
//! Conventions shared by every kernel:
//! - all buffers are row-major f32; matrices are stored (out, in) as in llm.c;
//! - backward kernels ACCUMULATE (`+=`) into every gradient they produce, so gradient
//!   accumulation and tied weights need no extra buffer; callers zero what must start at zero;
//! - a slice of the wrong length is a caller bug and panics (`# Panics`); the model validates
//!   user input before any kernel runs;
//! - threads: rayon over independent rows (deterministic: every output element is reduced in
//!   a fixed order by one thread), gemm's own rayon split for matrix products.

// llm.c's kernel signature (outputs, inputs, then every dimension) is the point of this module.
#![allow(clippy::too_many_arguments)]

pub mod attention;
pub mod cross_entropy;
pub mod encoder;
pub mod gelu;
pub mod layernorm;
mod math;
pub mod matmul;
pub mod residual;
pub mod vocab_parallel;

#[cfg(test)]
pub(crate) mod fd;

/// Rows handed to one rayon task by the row-parallel kernels: big enough to amortise the
/// task, small enough to balance 2..16 threads at B*T = 256.
pub(crate) const ROWS_PER_TASK: usize = 8;
