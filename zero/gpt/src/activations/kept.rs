//! Kept block inputs (activation checkpointing): where the input (N,C) of each checkpointed
//! segment waits between its forward and its recompute in backward.
//!
//! Legend: N = B*T positions, C channels, S segments = ceil(L/K).
//!
//! A caller's store implements [`KeptInputs`]: forward keeps segment s's input as the
//! segment starts, backward restores it before recomputing s, and a hint names the segment due
//! next, so an implementation in slower memory (zero-train's offload to pinned host memory)
//! can fetch it while the model computes. The model gives the hint twice: when the last
//! segment starts in forward (segment S-2 is the first one backward restores; the last one is
//! still in place and never recomputed), and right after each restore of segment s (s-1 is
//! next). Without a caller's store the model keeps them in one (S, N, C) buffer of the same
//! memory as the other activations ([`Kept::Local`]), copied into and out of by the backend's
//! `copy`; it ignores the hint.

use super::Buffer;
use crate::backend::{Backend, View};
use crate::error::{GptError, Result};
use crate::views::{sub, sub_mut};
use std::fmt;

/// Where the kept segment inputs live, viewed as `S` (a backend's `Slice`, host memory by
/// default). Calls come in the model's order: `keep` for segments 0, 1, .., S-1 in forward,
/// then `restore` for S-2, .., 0 in backward, with `due_next` hints between; a forward-only
/// pass keeps without restoring.
pub trait KeptInputs<S: ?Sized = [f32]>: Send + fmt::Debug {
    /// (S, N*C): the segments held and the elements of one input.
    fn shape(&self) -> (usize, usize);

    /// Keeps `input` (N,C) as segment `segment`'s input, replacing what was kept before.
    ///
    /// # Errors
    /// A segment past S, an input of the wrong length, or a failure of the memory behind.
    fn keep(&mut self, segment: usize, input: &S) -> Result<()>;

    /// Writes segment `segment`'s kept input into `input` (N,C).
    ///
    /// # Errors
    /// As [`keep`](Self::keep).
    fn restore(&mut self, segment: usize, input: &mut S) -> Result<()>;

    /// A hint: `segment` is the next one [`restore`](Self::restore) asks for, so it may be
    /// fetched now. Implementations that need no fetch ignore it.
    ///
    /// # Errors
    /// As [`keep`](Self::keep).
    fn due_next(&mut self, segment: usize) -> Result<()>;

    /// Bytes held in the memory the other activation buffers live in (the rank's arena).
    fn resident_bytes(&self) -> u64;

    /// Bytes held elsewhere (pinned host memory).
    fn offloaded_bytes(&self) -> u64;
}

/// The kept inputs of one [`crate::Activations`]: the model's own buffer, or a caller's store.
pub(crate) enum Kept<B: Backend> {
    /// S x (N,C) in one buffer of the backend's memory, segment s's input at `s*N*C`.
    Local {
        buf: Buffer<B::Slice>,
        input_len: usize,
    },
    /// A caller's store ([`crate::Activations::with_kept_inputs`]).
    Custom(Box<dyn KeptInputs<B::Slice>>),
}

impl<B: Backend> Kept<B> {
    /// A local store in `buf`, inputs of `input_len` (N*C) elements each; `buf`'s length
    /// must be a whole number of inputs.
    ///
    /// # Errors
    /// [`GptError::SizeMismatch`] if it is not, or `input_len` is 0.
    pub fn local(buf: Buffer<B::Slice>, input_len: usize) -> Result<Self> {
        let len = buf.floats().len();
        if input_len == 0 || len % input_len != 0 {
            return Err(GptError::SizeMismatch {
                what: "kept inputs (a whole number of (N,C) inputs)",
                expected: len.next_multiple_of(input_len.max(1)),
                got: len,
            });
        }
        Ok(Self::Local { buf, input_len })
    }

    pub fn shape(&self) -> (usize, usize) {
        match self {
            Self::Local { buf, input_len } => (buf.floats().len() / input_len, *input_len),
            Self::Custom(kept) => kept.shape(),
        }
    }

    fn range(&self, segment: usize, len: usize) -> Result<std::ops::Range<usize>> {
        let (segments, input_len) = self.shape();
        check_call((segments, input_len), segment, len)?;
        let at = segment * input_len;
        Ok(at..at + input_len)
    }

    pub fn keep(&mut self, backend: &B, segment: usize, input: &B::Slice) -> Result<()> {
        let range = self.range(segment, input.len())?;
        match self {
            Self::Local { buf, .. } => backend.copy(sub_mut(buf.floats_mut(), range), input),
            Self::Custom(kept) => kept.keep(segment, input)?,
        }
        Ok(())
    }

    pub fn restore(&mut self, backend: &B, segment: usize, input: &mut B::Slice) -> Result<()> {
        let range = self.range(segment, input.len())?;
        match self {
            Self::Local { buf, .. } => backend.copy(input, sub(buf.floats(), range)),
            Self::Custom(kept) => kept.restore(segment, input)?,
        }
        Ok(())
    }

    pub fn due_next(&mut self, segment: usize) -> Result<()> {
        match self {
            Self::Local { .. } => Ok(()),
            Self::Custom(kept) => kept.due_next(segment),
        }
    }

    pub fn resident_bytes(&self) -> u64 {
        match self {
            Self::Local { buf, .. } => 4 * buf.floats().len() as u64,
            Self::Custom(kept) => kept.resident_bytes(),
        }
    }

    pub fn offloaded_bytes(&self) -> u64 {
        match self {
            Self::Local { .. } => 0,
            Self::Custom(kept) => kept.offloaded_bytes(),
        }
    }
}

/// Refuses a segment past S and an input that is not N*C elements: the checks every
/// [`KeptInputs`] call makes first.
///
/// # Errors
/// [`GptError::KeptInputs`] for the segment, [`GptError::SizeMismatch`] for the length.
pub fn check_call((segments, input_len): (usize, usize), segment: usize, len: usize) -> Result<()> {
    if segment >= segments {
        return Err(GptError::KeptInputs {
            segment,
            reason: format!("only {segments} segments are kept"),
        });
    }
    if len != input_len {
        return Err(GptError::SizeMismatch {
            what: "kept input",
            expected: input_len,
            got: len,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CpuBackend;

    fn input(segment: usize, len: usize) -> Vec<f32> {
        (0..len).map(|i| (segment * 100 + i) as f32).collect()
    }

    fn local(len: usize, input_len: usize) -> Result<Kept<CpuBackend>> {
        Kept::local(Box::new(vec![0f32; len]), input_len)
    }

    #[test]
    fn local_store_restores_each_segment_as_kept() {
        let be = CpuBackend;
        let mut kept = local(3 * 4, 4).unwrap();
        assert_eq!(kept.shape(), (3, 4));
        for s in 0..3 {
            kept.keep(&be, s, &input(s, 4)).unwrap();
        }
        for s in (0..3).rev() {
            let mut out = vec![-1f32; 4];
            kept.restore(&be, s, &mut out).unwrap();
            assert_eq!(out, input(s, 4), "segment {s}");
        }
        assert_eq!((kept.resident_bytes(), kept.offloaded_bytes()), (48, 0));
    }

    #[test]
    fn local_store_refuses_a_segment_past_the_end_and_a_wrong_length() {
        let be = CpuBackend;
        let mut kept = local(2 * 4, 4).unwrap();
        assert!(matches!(
            kept.keep(&be, 2, &[0.0; 4]),
            Err(GptError::KeptInputs { segment: 2, .. })
        ));
        assert!(matches!(
            kept.restore(&be, 0, &mut [0.0; 3]),
            Err(GptError::SizeMismatch { got: 3, .. })
        ));
        assert!(local(7, 4).is_err());
    }
}
