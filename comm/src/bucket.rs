//! The paper's constant-size buffers for a partitioned tensor: a tensor of `world` equal
//! shards is reduced in buckets of a fixed size instead of in one piece, so the staging memory
//! is a few buckets whatever the tensor's size.
//!
//! Layout: bucket k holds, for every rank j, the k-th piece of shard j (segment j of the
//! bucket). One in-place reduce-scatter of the bucket then leaves rank r exactly its piece of
//! shard r, and an all-reduce every piece, so shards stay contiguous whatever the bucket
//! size. Each element is still reduced across ranks on its own, so the bucket size never
//! changes a bit of the result.
//!
//! [`ShardBuckets`] only computes the layout and packs; the caller owns the bucket buffers
//! (arena blocks, `Vec`s) and launches the collective of its choice on each, e.g. the
//! non-blocking forms so that reductions overlap the computation that follows.
//!
//! # Examples
//! ```
//! use zero_comm::{local, ReduceOp, ShardBuckets};
//!
//! let comms = local::create(2)?;
//! std::thread::scope(|s| {
//!     for comm in comms {
//!         s.spawn(move || -> zero_comm::Result<()> {
//!             let grads = vec![comm.rank() as f32 + 1.0; 6]; // 2 shards of 3
//!             let layout = ShardBuckets::new(2, 3, 4)?; // buckets of 2 x 2 elements at most
//!             let mut mine = vec![0.0; 3];
//!             for bucket in layout.buckets() {
//!                 let mut staged = vec![0.0; layout.bucket_elems(bucket)];
//!                 layout.pack(bucket, &grads, &mut staged, |src, dst| dst.copy_from_slice(src));
//!                 comm.reduce_scatter_in_place(&mut staged, ReduceOp::Sum)?;
//!                 let own = layout.segment(bucket, comm.rank());
//!                 mine[bucket.offset..bucket.offset + bucket.len].copy_from_slice(&staged[own]);
//!             }
//!             assert_eq!(mine, vec![3.0; 3]); // 1 + 2
//!             Ok(())
//!         });
//!     }
//! });
//! # Ok::<(), zero_comm::CommError>(())
//! ```

use std::ops::Range;

use crate::error::{CommError, Result};

/// One bucket: the pieces `[offset, offset + len)` of every rank's shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Bucket {
    /// First element of each piece, counted from the start of its shard.
    pub offset: usize,
    /// Elements in each piece.
    pub len: usize,
}

/// The bucket layout of a tensor of `world` shards of `shard_len` elements each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardBuckets {
    world: usize,
    shard_len: usize,
    piece: usize,
}

impl ShardBuckets {
    /// Buckets of at most `bucket_elems` elements, and never fewer than one element per rank.
    ///
    /// # Errors
    /// [`CommError::InvalidArgument`] when `world` is zero.
    pub fn new(world: usize, shard_len: usize, bucket_elems: usize) -> Result<Self> {
        if world == 0 {
            return Err(CommError::InvalidArgument {
                what: "bucket layout over a world of 0 ranks".into(),
            });
        }
        Ok(Self {
            world,
            shard_len,
            piece: (bucket_elems / world).max(1),
        })
    }

    /// The buckets in order; none for an empty tensor.
    pub fn buckets(&self) -> impl Iterator<Item = Bucket> + '_ {
        (0..self.shard_len)
            .step_by(self.piece)
            .map(|offset| Bucket {
                offset,
                len: self.piece.min(self.shard_len - offset),
            })
    }

    /// Elements of `bucket`'s buffer: one piece per rank.
    pub fn bucket_elems(&self, bucket: Bucket) -> usize {
        self.world * bucket.len
    }

    /// The largest bucket's elements (0 for an empty tensor).
    pub fn max_bucket_elems(&self) -> usize {
        self.world * self.max_piece_elems()
    }

    /// The largest piece of one rank's shard a bucket holds (0 for an empty tensor).
    pub fn max_piece_elems(&self) -> usize {
        self.piece.min(self.shard_len)
    }

    /// Where rank `rank`'s piece lies in `bucket`'s buffer.
    pub fn segment(&self, bucket: Bucket, rank: usize) -> Range<usize> {
        rank * bucket.len..(rank + 1) * bucket.len
    }

    /// Where rank `rank`'s piece of `bucket` lies in the whole tensor.
    pub fn source(&self, bucket: Bucket, rank: usize) -> Range<usize> {
        let start = rank * self.shard_len + bucket.offset;
        start..start + bucket.len
    }

    /// Fills `out` (the bucket's buffer) from the whole tensor, `convert(piece, segment)`
    /// per rank's piece (a copy, or a rounding to the element type reduced in).
    ///
    /// # Panics
    /// When `whole` holds fewer than `world * shard_len` elements or `out` is not
    /// [`ShardBuckets::bucket_elems`] long: buffers sized by this layout are the caller's
    /// invariant, not input.
    pub fn pack<S, D>(
        &self,
        bucket: Bucket,
        whole: &[S],
        out: &mut [D],
        mut convert: impl FnMut(&[S], &mut [D]),
    ) {
        assert_eq!(out.len(), self.bucket_elems(bucket), "bucket buffer length");
        assert!(
            whole.len() >= self.world * self.shard_len,
            "tensor too short"
        );
        for rank in 0..self.world {
            convert(
                &whole[self.source(bucket, rank)],
                &mut out[self.segment(bucket, rank)],
            );
        }
    }
}
