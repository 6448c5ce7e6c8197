//! What a model hands the engine: its units, and which of their elements take weight decay.

use super::partition::Shard;

/// One unit of parameters: a flat buffer of `numel` elements, cut into named tensors of which
/// some take weight decay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitSpec {
    /// A name for messages (`embeddings`, `block 3`, ...).
    pub name: String,
    /// Elements in the unit.
    pub numel: usize,
    /// Ranges of the unit that take decoupled weight decay (matrices); the rest do not.
    pub decay: Vec<Shard>,
}

impl UnitSpec {
    /// A unit with no weight decay anywhere.
    pub fn new(name: impl Into<String>, numel: usize) -> Self {
        Self {
            name: name.into(),
            numel,
            decay: Vec::new(),
        }
    }

    /// Adds a range that takes weight decay.
    pub fn with_decay(mut self, range: Shard) -> Self {
        self.decay.push(range);
        self
    }

    /// Checks that decay ranges lie inside the unit and do not overlap.
    pub(crate) fn check(&self) -> Result<(), String> {
        let mut ranges = self.decay.clone();
        ranges.sort_by_key(|r| r.offset);
        let mut end = 0;
        for r in &ranges {
            if r.offset < end {
                return Err(format!("decay ranges overlap at element {}", r.offset));
            }
            if r.end() > self.numel {
                return Err(format!(
                    "decay range {}..{} is past the unit's {} elements",
                    r.offset,
                    r.end(),
                    self.numel
                ));
            }
            end = r.end();
        }
        Ok(())
    }

    /// The segments of `window` (a range of the unit) as (range, decays) pairs in order,
    /// covering the window exactly.
    pub(crate) fn segments(&self, window: Shard) -> Vec<(Shard, bool)> {
        let mut decay: Vec<Shard> = self
            .decay
            .iter()
            .map(|r| r.intersect(window))
            .filter(|r| r.len > 0)
            .collect();
        decay.sort_by_key(|r| r.offset);
        let mut out = Vec::with_capacity(2 * decay.len() + 1);
        let mut at = window.offset;
        for r in decay {
            if r.offset > at {
                out.push((
                    Shard {
                        offset: at,
                        len: r.offset - at,
                    },
                    false,
                ));
            }
            out.push((r, true));
            at = r.end();
        }
        if window.end() > at {
            out.push((
                Shard {
                    offset: at,
                    len: window.end() - at,
                },
                false,
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(offset: usize, len: usize) -> Shard {
        Shard { offset, len }
    }

    #[test]
    fn segments_tile_the_window() {
        let u = UnitSpec::new("u", 100)
            .with_decay(s(10, 20))
            .with_decay(s(50, 10));
        let segs = u.segments(s(20, 40)); // 20..60
        assert_eq!(
            segs,
            vec![(s(20, 10), true), (s(30, 20), false), (s(50, 10), true)]
        );
        assert_eq!(u.segments(s(0, 0)), vec![]);
    }

    #[test]
    fn overlapping_or_oversized_decay_is_refused() {
        assert!(UnitSpec::new("u", 10)
            .with_decay(s(0, 5))
            .with_decay(s(4, 2))
            .check()
            .is_err());
        assert!(UnitSpec::new("u", 10).with_decay(s(8, 5)).check().is_err());
        assert!(UnitSpec::new("u", 10)
            .with_decay(s(0, 5))
            .with_decay(s(5, 5))
            .check()
            .is_ok());
    }
}
