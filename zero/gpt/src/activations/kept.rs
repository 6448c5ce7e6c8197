//! Kept block inputs (activation checkpointing): where the input (N,C) of each checkpointed
//! segment waits between its forward and its recompute in backward.
//!
//! Legend: N = B*T positions, C channels, S segments = ceil(L/K).
//!
//! The model reaches them only through [`KeptInputs`]: forward keeps segment s's input as the
//! segment starts, backward restores it before recomputing s, and a hint names the segment due
//! next, so an implementation in slower memory (zero-train's offload to pinned host memory)
//! can fetch it while the model computes. The model gives the hint twice: when the last
//! segment starts in forward (segment S-2 is the first one backward restores; the last one is
//! still in place and never recomputed), and right after each restore of segment s (s-1 is
//! next). [`InMemory`], the default, is one (S, N, C) buffer in the same memory as the other
//! activations, copied into and out of synchronously; it ignores the hint.

use super::Buffer;
use crate::error::{GptError, Result};
use std::fmt;

/// Where the kept segment inputs live. Calls come in the model's order: `keep` for segments
/// 0, 1, .., S-1 in forward, then `restore` for S-2, .., 0 in backward, with `due_next`
/// hints between; a forward-only pass keeps without restoring.
pub trait KeptInputs: Send + fmt::Debug {
    /// (S, N*C): the segments held and the elements of one input.
    fn shape(&self) -> (usize, usize);

    /// Keeps `input` (N,C) as segment `segment`'s input, replacing what was kept before.
    ///
    /// # Errors
    /// A segment past S, an input of the wrong length, or a failure of the memory behind.
    fn keep(&mut self, segment: usize, input: &[f32]) -> Result<()>;

    /// Writes segment `segment`'s kept input into `input` (N,C).
    ///
    /// # Errors
    /// As [`keep`](Self::keep).
    fn restore(&mut self, segment: usize, input: &mut [f32]) -> Result<()>;

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

/// The default [`KeptInputs`]: one buffer of S x (N,C), segment s's input at `s*N*C`.
#[derive(Debug)]
pub struct InMemory {
    buf: Buffer,
    input_len: usize,
}

impl InMemory {
    /// Kept inputs in `buf`, inputs of `input_len` (N*C) elements each; `buf`'s length must
    /// be a whole number of inputs.
    ///
    /// # Errors
    /// [`GptError::SizeMismatch`] if it is not, or `input_len` is 0.
    pub fn new(buf: Buffer, input_len: usize) -> Result<Self> {
        let len = buf.floats().len();
        if input_len == 0 || len % input_len != 0 {
            return Err(GptError::SizeMismatch {
                what: "kept inputs (a whole number of (N,C) inputs)",
                expected: len.next_multiple_of(input_len.max(1)),
                got: len,
            });
        }
        Ok(Self { buf, input_len })
    }

    fn range(&self, segment: usize, len: usize) -> Result<std::ops::Range<usize>> {
        check_call(self.shape(), segment, len)?;
        let at = segment * self.input_len;
        Ok(at..at + self.input_len)
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

impl KeptInputs for InMemory {
    fn shape(&self) -> (usize, usize) {
        (self.buf.floats().len() / self.input_len, self.input_len)
    }

    fn keep(&mut self, segment: usize, input: &[f32]) -> Result<()> {
        let range = self.range(segment, input.len())?;
        self.buf.floats_mut()[range].copy_from_slice(input);
        Ok(())
    }

    fn restore(&mut self, segment: usize, input: &mut [f32]) -> Result<()> {
        let range = self.range(segment, input.len())?;
        input.copy_from_slice(&self.buf.floats()[range]);
        Ok(())
    }

    fn due_next(&mut self, _segment: usize) -> Result<()> {
        Ok(())
    }

    fn resident_bytes(&self) -> u64 {
        4 * self.buf.floats().len() as u64
    }

    fn offloaded_bytes(&self) -> u64 {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(segment: usize, len: usize) -> Vec<f32> {
        (0..len).map(|i| (segment * 100 + i) as f32).collect()
    }

    #[test]
    fn in_memory_restores_each_segment_as_kept() {
        let mut kept = InMemory::new(Box::new(vec![0f32; 3 * 4]), 4).unwrap();
        assert_eq!(kept.shape(), (3, 4));
        for s in 0..3 {
            kept.keep(s, &input(s, 4)).unwrap();
        }
        for s in (0..3).rev() {
            let mut out = vec![-1f32; 4];
            kept.restore(s, &mut out).unwrap();
            assert_eq!(out, input(s, 4), "segment {s}");
        }
        assert_eq!((kept.resident_bytes(), kept.offloaded_bytes()), (48, 0));
    }

    #[test]
    fn in_memory_refuses_a_segment_past_the_end_and_a_wrong_length() {
        let mut kept = InMemory::new(Box::new(vec![0f32; 2 * 4]), 4).unwrap();
        assert!(matches!(
            kept.keep(2, &[0.0; 4]),
            Err(GptError::KeptInputs { segment: 2, .. })
        ));
        assert!(matches!(
            kept.restore(0, &mut [0.0; 3]),
            Err(GptError::SizeMismatch { got: 3, .. })
        ));
        assert!(InMemory::new(Box::new(vec![0f32; 7]), 4).is_err());
    }
}
