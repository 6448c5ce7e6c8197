//! Moving an opaque id (NCCL's unique id) from one rank to the others over a host
//! [`Communicator`] that already joins them: the TCP backend under a torchrun-style launch.
//!
//! The communicator moves typed elements, so the bytes travel as 4-byte words, each word's
//! bits carried unchanged in an `f32` by [`f32::from_bits`] (a broadcast copies elements; no
//! backend does arithmetic on them, and the round trip is tested with NaN bit patterns).

use crate::communicator::Communicator;
use crate::error::{CommError, Result};

/// Copies `root`'s `id` into every rank's `id`. Collective over `comm`; every rank passes the
/// same length (the broadcast checks it).
///
/// # Errors
/// The broadcast's errors (a rank that does not arrive within the communicator's timeout, a
/// length mismatch); [`CommError::InvalidArgument`] for a root outside the group.
pub fn broadcast_id(comm: &Communicator, id: &mut [u8], root: usize) -> Result<()> {
    if root >= comm.size() {
        return Err(CommError::InvalidArgument {
            what: format!("broadcast_id root {root} in a group of {}", comm.size()),
        });
    }
    let mut words: Vec<f32> = id
        .chunks(4)
        .map(|chunk| {
            let mut word = [0u8; 4];
            word[..chunk.len()].copy_from_slice(chunk);
            f32::from_bits(u32::from_le_bytes(word))
        })
        .collect();
    comm.broadcast_in_place(&mut words, root)?;
    for (chunk, word) in id.chunks_mut(4).zip(&words) {
        chunk.copy_from_slice(&word.to_bits().to_le_bytes()[..chunk.len()]);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::broadcast_id;
    use crate::local;

    /// Every byte value, NaN word patterns (0x7f800001.., 0xffc00000..) and a ragged tail.
    fn root_id(len: usize) -> Vec<u8> {
        let nan_words = [0x7f80_0001u32, 0xffc0_0000, 0x7fff_ffff, 0xff80_0001];
        let mut id: Vec<u8> = nan_words.iter().flat_map(|w| w.to_le_bytes()).collect();
        id.extend((0..len).map(|i| (i * 7 + 3) as u8));
        id.truncate(len);
        id
    }

    #[test]
    fn every_rank_gets_the_roots_bytes_exactly() {
        for (ranks, len, root) in [(1, 128, 0), (3, 128, 0), (4, 130, 2), (2, 3, 1)] {
            let want = root_id(len);
            let comms = local::create(ranks).unwrap();
            let got: Vec<Vec<u8>> = std::thread::scope(|s| {
                let handles: Vec<_> = comms
                    .into_iter()
                    .map(|c| {
                        let mine = if c.rank() == root {
                            want.clone()
                        } else {
                            vec![0; len]
                        };
                        s.spawn(move || {
                            let mut id = mine;
                            broadcast_id(&c, &mut id, root).unwrap();
                            id
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            for (rank, id) in got.iter().enumerate() {
                assert_eq!(
                    id, &want,
                    "rank {rank} of {ranks}, {len} bytes, root {root}"
                );
            }
        }
    }

    #[test]
    fn a_root_outside_the_group_is_an_error() {
        let comms = local::create(1).unwrap();
        let err = broadcast_id(&comms[0], &mut [0u8; 8], 1).unwrap_err();
        assert!(err.to_string().contains("root 1"), "{err}");
    }
}
