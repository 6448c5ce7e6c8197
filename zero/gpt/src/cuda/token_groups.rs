//! The positions of a micro-batch grouped by token (a CSR), built on the host where the ids
//! are uploaded, for the CUDA backend's `encoder_backward_wte_grouped`: one block per
//! distinct token adds that token's rows of dout, in increasing position order, into its row
//! of dwte, which is the CPU kernel's order for every (token, channel): bitwise, with no
//! atomics and no thread walking all N rows.
//!
//! Legend: N positions (B*T), U distinct tokens, C channels.
//!
//! Device layout ([`TokenGroups::words`], one u32 buffer, offsets in [`WordLayout`]):
//! `flag (1) | positions (N) | slot_tokens (N) | offsets (U + 1) | tokens (U)`. Group `u`
//! holds `positions[offsets[u]..offsets[u + 1]]`, increasing, all of token `tokens[u]`;
//! `slot_tokens[i]` is the token of the group slot `i` belongs to. The flag is the check's:
//! before the sums, one thread per slot compares `ids[positions[i]]` with `slot_tokens[i]`
//! and sets it on any difference (ids changed on the device since the upload), and then the
//! one-thread-per-channel kernel runs instead. Since the positions are a permutation of
//! 0..N and the tokens of the groups distinct, a passing check proves the grouping is the
//! ids' own.

use crate::{GptError, Result};

/// Positions grouped by token: distinct tokens increasing, each group's positions increasing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenGroups {
    /// (N,) the positions, group after group.
    pub positions: Vec<u32>,
    /// (U + 1,) group `u` is `positions[offsets[u]..offsets[u + 1]]`.
    pub offsets: Vec<u32>,
    /// (U,) the token of each group, increasing.
    pub tokens: Vec<u32>,
}

/// Where each part of [`TokenGroups::words`] starts, in u32 words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WordLayout {
    /// Positions N.
    pub n: usize,
    /// Distinct tokens U.
    pub groups: usize,
}

impl WordLayout {
    /// The check flag's word.
    pub const FLAG: usize = 0;
    /// First word of `positions`.
    pub const POSITIONS: usize = 1;
    /// First word of `slot_tokens`.
    #[must_use]
    pub fn slot_tokens(&self) -> usize {
        1 + self.n
    }
    /// First word of `offsets`.
    #[must_use]
    pub fn offsets(&self) -> usize {
        1 + 2 * self.n
    }
    /// First word of `tokens`.
    #[must_use]
    pub fn tokens(&self) -> usize {
        2 + 2 * self.n + self.groups
    }
    /// Words in all.
    #[must_use]
    pub fn len(&self) -> usize {
        2 + 2 * self.n + 2 * self.groups
    }
    /// Never true: the flag is always there.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        false
    }
}

impl TokenGroups {
    /// Groups the positions of `ids` by token.
    ///
    /// # Errors
    /// [`GptError::LaunchTooLarge`] when N does not fit a u32 (the kernels index with u32).
    pub fn of(ids: &[u32]) -> Result<Self> {
        let n = u32::try_from(ids.len()).map_err(|_| GptError::LaunchTooLarge {
            kernel: "encoder_backward_wte_grouped",
            what: "positions",
            value: ids.len(),
            limit: u32::MAX as usize,
        })?;
        let mut positions: Vec<u32> = (0..n).collect();
        // Stable: equal tokens keep their increasing positions.
        positions.sort_by_key(|&p| ids[p as usize]);
        let (mut offsets, mut tokens) = (vec![0u32], Vec::new());
        for (slot, &p) in (0u32..).zip(&positions) {
            let tok = ids[p as usize];
            if tokens.last() != Some(&tok) {
                if slot > 0 {
                    offsets.push(slot);
                }
                tokens.push(tok);
            }
        }
        if n > 0 {
            offsets.push(n);
        }
        Ok(Self {
            positions,
            offsets,
            tokens,
        })
    }

    /// The sizes of [`TokenGroups::words`]' parts.
    #[must_use]
    pub fn layout(&self) -> WordLayout {
        WordLayout {
            n: self.positions.len(),
            groups: self.tokens.len(),
        }
    }

    /// The device buffer: `flag | positions | slot_tokens | offsets | tokens`, flag 0.
    #[must_use]
    pub fn words(&self) -> Vec<u32> {
        let mut w = Vec::with_capacity(self.layout().len());
        w.push(0);
        w.extend_from_slice(&self.positions);
        for (u, pair) in self.offsets.windows(2).enumerate() {
            w.extend((pair[0]..pair[1]).map(|_| self.tokens[u]));
        }
        w.extend_from_slice(&self.offsets);
        w.extend_from_slice(&self.tokens);
        w
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::encoder;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    /// The reference: a map from token to its positions, filled in position order.
    fn naive(ids: &[u32]) -> BTreeMap<u32, Vec<u32>> {
        let mut m: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        for (p, &t) in ids.iter().enumerate() {
            m.entry(t).or_default().push(p as u32);
        }
        m
    }

    fn assert_matches_naive(ids: &[u32]) {
        let g = TokenGroups::of(ids).unwrap();
        let want = naive(ids);
        assert_eq!(
            g.tokens,
            want.keys().copied().collect::<Vec<_>>(),
            "{ids:?}"
        );
        assert_eq!(g.offsets.len(), g.tokens.len() + 1);
        for (u, pos) in want.values().enumerate() {
            let got = &g.positions[g.offsets[u] as usize..g.offsets[u + 1] as usize];
            assert_eq!(got, pos.as_slice(), "{ids:?}, group {u}");
        }
    }

    #[test]
    fn hand_cases_group_like_the_naive_map() {
        let g = TokenGroups::of(&[5, 2, 5, 5, 0, 2]).unwrap();
        assert_eq!(g.tokens, [0, 2, 5]);
        assert_eq!(g.offsets, [0, 1, 3, 6]);
        assert_eq!(g.positions, [4, 1, 5, 0, 2, 3]);
        let one = TokenGroups::of(&[7; 4]).unwrap();
        assert_eq!(
            (one.tokens, one.offsets, one.positions),
            (vec![7], vec![0, 4], vec![0, 1, 2, 3])
        );
        let distinct = TokenGroups::of(&[3, 1, 2]).unwrap();
        assert_eq!(distinct.offsets, [0, 1, 2, 3]);
        assert_eq!(distinct.positions, [1, 2, 0]);
        let empty = TokenGroups::of(&[]).unwrap();
        assert_eq!((empty.layout().len(), empty.offsets), (2, vec![0]));
    }

    proptest! {
        #[test]
        fn groups_match_the_naive_map(ids in proptest::collection::vec(0u32..9, 0..200)) {
            assert_matches_naive(&ids);
        }
    }

    /// The device's work over `words`, on the CPU: the check (one thread per slot), then,
    /// with the flag clear, one group at a time adding its rows in slot order (the kernel's
    /// per-channel loop), else nothing (the fallback kernel then runs).
    fn emulate(
        dwte: &mut [f32],
        dout: &[f32],
        ids: &[u32],
        words: &mut [u32],
        l: WordLayout,
        c: usize,
    ) -> bool {
        for i in 0..l.n {
            let pos = words[WordLayout::POSITIONS + i] as usize;
            if ids[pos] != words[l.slot_tokens() + i] {
                words[WordLayout::FLAG] = 1;
            }
        }
        if words[WordLayout::FLAG] != 0 {
            return false;
        }
        for u in 0..l.groups {
            let tok = words[l.tokens() + u] as usize;
            let (begin, end) = (words[l.offsets() + u], words[l.offsets() + u + 1]);
            for j in 0..c {
                let mut acc = dwte[tok * c + j];
                for i in begin..end {
                    let row = words[WordLayout::POSITIONS + i as usize] as usize;
                    acc += dout[row * c + j];
                }
                dwte[tok * c + j] = acc;
            }
        }
        true
    }

    #[test]
    fn grouped_sums_over_the_device_layout_are_the_cpu_kernels_bits() {
        let (b, t, c, vp) = (4, 64, 24, 50);
        let mut rng = crate::Rng::new(5);
        // Skewed ids: a few tokens repeat many times, as in text.
        let ids: Vec<u32> = (0..b * t)
            .map(|_| ((rng.uniform().powi(3)) * vp as f64) as u32)
            .collect();
        let dout: Vec<f32> = (0..b * t * c)
            .map(|_| (rng.uniform() * 2.0 - 1.0) as f32)
            .collect();
        let init: Vec<f32> = (0..vp * c)
            .map(|_| (rng.uniform() * 2.0 - 1.0) as f32)
            .collect();
        let (mut want, mut dwpe) = (init.clone(), vec![0.0; t * c]);
        encoder::encoder_backward(&mut want, &mut dwpe, &dout, &ids, b, t, c);
        let g = TokenGroups::of(&ids).unwrap();
        let mut got = init.clone();
        assert!(emulate(
            &mut got,
            &dout,
            &ids,
            &mut g.words(),
            g.layout(),
            c
        ));
        assert!(got
            .iter()
            .zip(&want)
            .all(|(a, w)| a.to_bits() == w.to_bits()));
        // Summing a group in another order (decreasing positions) is not bitwise: the order matters.
        let mut rev = g.clone();
        for pair in g.offsets.windows(2) {
            rev.positions[pair[0] as usize..pair[1] as usize].reverse();
        }
        let mut other = init;
        emulate(&mut other, &dout, &ids, &mut rev.words(), rev.layout(), c);
        assert!(other
            .iter()
            .zip(&want)
            .any(|(a, w)| a.to_bits() != w.to_bits()));
    }

    #[test]
    fn the_check_flags_ids_that_changed_after_grouping() {
        let ids = vec![1u32, 2, 1, 3];
        let g = TokenGroups::of(&ids).unwrap();
        let (mut dwte, dout) = (vec![0.0; 4 * 2], vec![1.0; 4 * 2]);
        for changed in [vec![1u32, 2, 1, 1], vec![2, 1, 1, 3], vec![3, 2, 1, 1]] {
            let mut words = g.words();
            assert!(
                !emulate(&mut dwte, &dout, &changed, &mut words, g.layout(), 2),
                "{changed:?}"
            );
            assert_eq!(words[WordLayout::FLAG], 1);
        }
        assert!(dwte.iter().all(|&x| x == 0.0));
        assert!(emulate(
            &mut dwte,
            &dout,
            &ids,
            &mut g.words(),
            g.layout(),
            2
        ));
    }
}
