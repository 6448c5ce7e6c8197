//! How the backends cut an array among ranks for the reduce phase of all-reduce and reduce:
//! one function, so the local and MPI backends agree on which rank reduces which elements.

/// Element range [lo, hi) of chunk `j` when `n` elements are split in `parts` (balanced; the
/// chunking does not affect results, which are per element, it only balances the work).
pub(crate) fn chunk(n: usize, parts: usize, j: usize) -> (usize, usize) {
    (j * n / parts, (j + 1) * n / parts)
}

#[cfg(test)]
mod tests {
    use super::chunk;

    #[test]
    fn chunks_tile_the_array_in_order() {
        for parts in 1..=5 {
            for n in [0, 1, 7, 100] {
                let mut next = 0;
                for j in 0..parts {
                    let (lo, hi) = chunk(n, parts, j);
                    assert_eq!(lo, next, "n {n} parts {parts} chunk {j}");
                    assert!(hi - lo <= n.div_ceil(parts), "balanced");
                    next = hi;
                }
                assert_eq!(next, n);
            }
        }
    }
}
