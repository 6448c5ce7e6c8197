//! The header both llm.c file formats open with (token files and float32 checkpoints): 256
//! little-endian int32 words, of which each format uses the first few.

/// Words in the header.
pub const HEADER_WORDS: usize = 256;
/// Bytes in the header.
pub const HEADER_BYTES: usize = 4 * HEADER_WORDS;

/// Word `i` of `header`. The caller has checked that `header` holds [`HEADER_BYTES`] bytes
/// (each format reports a short header with its own error).
pub(crate) fn word(header: &[u8], i: usize) -> i32 {
    let b = &header[4 * i..4 * i + 4];
    i32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

/// The header holding `words` first and zeros after.
pub(crate) fn encode(words: &[i32]) -> [u8; HEADER_BYTES] {
    let mut out = [0u8; HEADER_BYTES];
    for (slot, w) in out.chunks_exact_mut(4).zip(words) {
        slot.copy_from_slice(&w.to_le_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_round_trip_and_the_rest_is_zero() {
        let h = encode(&[20_240_520, -1, 7]);
        assert_eq!((word(&h, 0), word(&h, 1), word(&h, 2)), (20_240_520, -1, 7));
        assert!((3..HEADER_WORDS).all(|i| word(&h, i) == 0));
        assert_eq!(&h[..4], &20_240_520i32.to_le_bytes());
    }
}
