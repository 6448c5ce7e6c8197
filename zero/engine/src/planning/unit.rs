//! What a model hands the engine: its units, and which of their elements take weight decay.

use crate::optim::DecaySegment;
use std::ops::Range;

/// One unit of parameters: a flat buffer of `numel` elements, cut into named tensors of which
/// some take weight decay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitSpec {
    /// A name for messages (`embeddings`, `block 3`, ...).
    pub name: String,
    /// Elements in the unit.
    pub numel: usize,
    /// Ranges of the unit that take decoupled weight decay (matrices); the rest do not.
    pub decay: Vec<Range<usize>>,
    /// Under tensor parallelism ([`Engine::with_tensor_parallel`](crate::Engine)): the unit
    /// holds this rank's slice of tensors split across the tensor-parallel group, so its
    /// gradient's squares are summed over the group; otherwise every tensor-parallel rank
    /// holds the same unit, counted once.
    pub tp_sharded: bool,
}

impl UnitSpec {
    /// A unit with no weight decay anywhere.
    pub fn new(name: impl Into<String>, numel: usize) -> Self {
        Self {
            name: name.into(),
            numel,
            decay: Vec::new(),
            tp_sharded: false,
        }
    }

    /// This unit, a slice of tensors split across the tensor-parallel group.
    #[must_use]
    pub fn tp_sharded(mut self) -> Self {
        self.tp_sharded = true;
        self
    }

    /// Adds a range that takes weight decay.
    pub fn with_decay(mut self, range: Range<usize>) -> Self {
        self.decay.push(range);
        self
    }

    /// Checks that decay ranges lie inside the unit and do not overlap.
    pub(crate) fn check(&self) -> Result<(), String> {
        let mut ranges = self.decay.clone();
        ranges.sort_by_key(|r| r.start);
        let mut end = 0;
        for r in &ranges {
            if r.start < end {
                return Err(format!("decay ranges overlap at element {}", r.start));
            }
            if r.end > self.numel || r.start > r.end {
                return Err(format!(
                    "decay range {}..{} is not inside the unit's {} elements",
                    r.start, r.end, self.numel
                ));
            }
            end = r.end;
        }
        Ok(())
    }

    /// The unit's elements as decay segments in order, covering `0..numel` exactly: the
    /// form AdamW takes.
    pub(crate) fn decay_segments(&self) -> Vec<DecaySegment> {
        let mut decay: Vec<Range<usize>> = self
            .decay
            .iter()
            .filter(|r| !r.is_empty())
            .cloned()
            .collect();
        decay.sort_by_key(|r| r.start);
        let mut out = Vec::with_capacity(2 * decay.len() + 1);
        let mut at = 0;
        for range in decay {
            if range.start > at {
                out.push(DecaySegment {
                    range: at..range.start,
                    decay: false,
                });
            }
            at = range.end;
            out.push(DecaySegment { range, decay: true });
        }
        if self.numel > at {
            out.push(DecaySegment {
                range: at..self.numel,
                decay: false,
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(range: Range<usize>, decay: bool) -> DecaySegment {
        DecaySegment { range, decay }
    }

    #[test]
    fn decay_segments_tile_the_unit() {
        let u = UnitSpec::new("u", 100)
            .with_decay(50..60)
            .with_decay(10..30);
        assert_eq!(
            u.decay_segments(),
            vec![
                seg(0..10, false),
                seg(10..30, true),
                seg(30..50, false),
                seg(50..60, true),
                seg(60..100, false)
            ]
        );
        assert_eq!(UnitSpec::new("e", 0).decay_segments(), vec![]);
    }

    #[test]
    fn overlapping_or_oversized_decay_is_refused() {
        assert!(UnitSpec::new("u", 10)
            .with_decay(0..5)
            .with_decay(4..6)
            .check()
            .is_err());
        assert!(UnitSpec::new("u", 10).with_decay(8..13).check().is_err());
        assert!(UnitSpec::new("u", 10)
            .with_decay(0..5)
            .with_decay(5..10)
            .check()
            .is_ok());
    }
}
