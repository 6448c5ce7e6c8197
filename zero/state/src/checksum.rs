//! The per-tensor checksum of training states: FNV-1a's xor-then-multiply step applied to
//! little-endian 64-bit words in four independent lanes, folded together with the length.
//!
//! Byte-wise FNV-1a ran at 0.34 GB/s on the 2-core CI machine, slower than the disk reads
//! it guards; four word lanes keep the multiplier pipeline busy. Each step `h = (h ^ w) * p`
//! with odd `p` is a bijection of `h`, so changing any one word always changes its lane's
//! final value: every torn or flipped word is detected. It is not a defence against
//! deliberate tampering.

const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const PRIME: u64 = 0x0000_0100_0000_01b3;
const BLOCK: usize = 32;

/// Streaming checksum; the result does not depend on how the input is split into calls.
#[derive(Debug, Clone)]
pub(crate) struct Checksum {
    lanes: [u64; 4],
    pending: [u8; BLOCK],
    pending_len: usize,
    len: u64,
}

impl Checksum {
    pub(crate) fn new() -> Self {
        // Distinct lane seeds so that permuting words across lanes changes the result.
        let lanes = [OFFSET, OFFSET ^ 1, OFFSET ^ 2, OFFSET ^ 3];
        Self {
            lanes,
            pending: [0; BLOCK],
            pending_len: 0,
            len: 0,
        }
    }

    fn block(&mut self, block: &[u8]) {
        for (lane, w) in self.lanes.iter_mut().zip(block.chunks_exact(8)) {
            let mut word = [0u8; 8];
            word.copy_from_slice(w);
            *lane = (*lane ^ u64::from_le_bytes(word)).wrapping_mul(PRIME);
        }
    }

    pub(crate) fn update(&mut self, mut bytes: &[u8]) {
        self.len += bytes.len() as u64;
        if self.pending_len > 0 {
            let take = (BLOCK - self.pending_len).min(bytes.len());
            self.pending[self.pending_len..self.pending_len + take].copy_from_slice(&bytes[..take]);
            self.pending_len += take;
            bytes = &bytes[take..];
            if self.pending_len < BLOCK {
                return;
            }
            let block = self.pending;
            self.block(&block);
            self.pending_len = 0;
        }
        let mut blocks = bytes.chunks_exact(BLOCK);
        for b in &mut blocks {
            self.block(b);
        }
        let rest = blocks.remainder();
        self.pending[..rest.len()].copy_from_slice(rest);
        self.pending_len = rest.len();
    }

    pub(crate) fn finish(mut self) -> u64 {
        if self.pending_len > 0 {
            // Zero padding is told apart from real zeros by the length folded in below.
            let mut block = [0u8; BLOCK];
            block[..self.pending_len].copy_from_slice(&self.pending[..self.pending_len]);
            self.block(&block);
        }
        let mut h = OFFSET;
        for lane in self.lanes.into_iter().chain([self.len]) {
            h = (h ^ lane).wrapping_mul(PRIME);
            h ^= h >> 29;
        }
        h
    }
}

#[cfg(test)]
mod tests {
    use super::Checksum;
    use proptest::prelude::*;

    fn once(bytes: &[u8]) -> u64 {
        let mut c = Checksum::new();
        c.update(bytes);
        c.finish()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn split_points_do_not_matter(bytes in prop::collection::vec(any::<u8>(), 0..300), cuts in prop::collection::vec(0usize..300, 0..6)) {
            let mut cuts: Vec<usize> = cuts.into_iter().filter(|&c| c <= bytes.len()).collect();
            cuts.extend([0, bytes.len()]);
            cuts.sort_unstable();
            let mut c = Checksum::new();
            for w in cuts.windows(2) {
                c.update(&bytes[w[0]..w[1]]);
            }
            prop_assert_eq!(c.finish(), once(&bytes));
        }

        #[test]
        fn any_bit_flip_changes_the_sum(bytes in prop::collection::vec(any::<u8>(), 1..300), at in any::<prop::sample::Index>(), bit in 0u8..8) {
            let mut flipped = bytes.clone();
            flipped[at.index(bytes.len())] ^= 1 << bit;
            prop_assert_ne!(once(&flipped), once(&bytes));
        }
    }

    #[test]
    fn trailing_zeros_and_lane_swaps_are_seen() {
        assert_ne!(once(&[1, 2, 3]), once(&[1, 2, 3, 0]));
        assert_ne!(once(&[]), once(&[0]));
        let a: Vec<u8> = (0..32).collect();
        let mut b = a.clone();
        b.rotate_left(8); // the same words, in other lanes
        assert_ne!(once(&a), once(&b));
    }
}
