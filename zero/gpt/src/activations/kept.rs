//! Kept block inputs (activation checkpointing): where the input (N,C) of each checkpointed
//! segment waits between its forward and its recompute in backward.
//!
//! Legend: N = B*T positions, C channels, S segments = ceil(L/K).
//!
//! Either the activations keep them, in one (S, N, C) buffer of the same memory as the other
//! activations ([`Kept::Local`], copied into and out of by the backend's `copy`), or the
//! caller does ([`KeptBy::Caller`]): it takes each recomputed segment's input after the
//! segment's first block runs forward ([`crate::Gpt::keep_input`]) and hands it back before
//! that block's recompute ([`crate::Gpt::restore_input`]), from memory of its own (an
//! engine's store, in its arena or offloaded to host memory).

use super::Buffer;
use crate::backend::{Backend, View};
use crate::error::{GptError, Result};
use crate::views::{sub, sub_mut};

/// Who keeps the checkpointed segments' inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeptBy {
    /// The activations, in a buffer of their own ([`crate::KEPT_INPUTS`]).
    Model,
    /// The caller, through [`crate::Gpt::keep_input`] and [`crate::Gpt::restore_input`];
    /// the activations hold no buffer for them.
    Caller,
}

/// The kept inputs of one [`crate::Activations`].
pub(crate) enum Kept<B: Backend> {
    /// S x (N,C) in one buffer of the backend's memory, segment s's input at `s*N*C`.
    Local {
        buf: Buffer<B::Slice>,
        input_len: usize,
    },
    /// The caller keeps them; `restored` is the segment whose input it handed back for the
    /// next recompute.
    Caller {
        segments: usize,
        input_len: usize,
        restored: Option<usize>,
    },
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

    /// (S, N*C): the segments and the elements of one input.
    pub fn shape(&self) -> (usize, usize) {
        match self {
            Self::Local { buf, input_len } => (buf.floats().len() / input_len, *input_len),
            Self::Caller {
                segments,
                input_len,
                ..
            } => (*segments, *input_len),
        }
    }

    fn range(&self, segment: usize, len: usize) -> Result<std::ops::Range<usize>> {
        let (segments, input_len) = self.shape();
        check_call((segments, input_len), segment, len)?;
        let at = segment * input_len;
        Ok(at..at + input_len)
    }

    /// Keeps `input` as segment `segment`'s (the caller's store keeps it itself).
    pub fn keep(&mut self, backend: &B, segment: usize, input: &B::Slice) -> Result<()> {
        let range = self.range(segment, input.len())?;
        if let Self::Local { buf, .. } = self {
            backend.copy(sub_mut(buf.floats_mut(), range), input);
        }
        Ok(())
    }

    /// Writes segment `segment`'s input into `input`; with the caller's store, checks that
    /// the caller handed it back ([`crate::Gpt::restore_input`]).
    pub fn restore(&mut self, backend: &B, segment: usize, input: &mut B::Slice) -> Result<()> {
        let range = self.range(segment, input.len())?;
        match self {
            Self::Local { buf, .. } => backend.copy(input, sub(buf.floats(), range)),
            Self::Caller { restored, .. } => {
                if restored.take() != Some(segment) {
                    return Err(GptError::KeptInputs {
                        segment,
                        reason: "its input was not handed back (restore_input) before the \
                                 recompute"
                            .into(),
                    });
                }
            }
        }
        Ok(())
    }

    /// Bytes held in the activations' memory.
    pub fn resident_bytes(&self) -> u64 {
        match self {
            Self::Local { buf, .. } => 4 * buf.floats().len() as u64,
            Self::Caller { .. } => 0,
        }
    }
}

/// Refuses a segment past S and an input that is not N*C elements: the checks every keep and
/// restore makes first.
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
        assert_eq!(kept.resident_bytes(), 48);
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
