//! The paper's constant-size buffers: pack many tensors into fixed-size buckets and run one
//! collective per bucket.
//!
//! Two buffers of `bucket_bytes` are allocated when the bucketer is made and never again: one
//! fills while the other is in flight (non-blocking, so packing overlaps communication). The
//! memory is fixed whatever the number or size of tensors; a tensor larger than a bucket is
//! cut into pieces. [`Bucketer::new`] allocates the two buffers as `Vec`s;
//! [`Bucketer::with_buffers`] takes any two owned buffers instead (zero-alloc's `Lent` arena
//! blocks, so the bucket memory is measured by the rank's arena), and
//! [`Bucketer::into_buffers`] hands them back.
//!
//! Layout for reduce-scatter and all-gather: a bucket is N segments; segment j holds shard j
//! of every packed piece, so one in-place reduce-scatter of the bucket leaves each rank exactly
//! its shards of every tensor, and one in-place all-gather fills every tensor's full buffer.

use std::collections::VecDeque;

use crate::communicator::{Collective, Communicator};
use crate::dtype::Element;
use crate::error::{CommError, Result};
use crate::reduce_op::ReduceOp;
use crate::work::Work;

/// The collective a bucketer runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BucketKind {
    /// Each tensor gets the reduction of everyone's tensor (ZeRO stage 0).
    AllReduce(ReduceOp),
    /// Each tensor (length N*s) gives this rank its shard r (length s) of the reduction
    /// (ZeRO-2's gradient reduce-scatter during backward).
    ReduceScatter(ReduceOp),
    /// Each shard (length s) becomes the full tensor (N*s) (ZeRO-3's coalesced all-gathers).
    AllGather,
}

/// Where one tensor's result goes.
#[derive(Debug)]
struct Dest<'a, T> {
    out: &'a mut [T],
    /// Shard length s (the whole length for all-reduce).
    shard: usize,
    /// Offset of the result (in-place reduce-scatter) or input (in-place all-gather) in `out`.
    own: usize,
    /// Pieces not yet delivered.
    pending: usize,
    /// Still being packed: not released even when `pending` touches 0.
    packing: bool,
}

/// One piece of one tensor in a bucket: shard elements [a, a+p) at segment offset `at`.
#[derive(Debug, Clone, Copy)]
struct Item {
    dest: u64,
    a: usize,
    p: usize,
    at: usize,
}

#[derive(Debug)]
struct InFlight<B> {
    work: Work<Prefix<B>>,
    items: Vec<Item>,
    stride: usize,
}

/// The first `len` elements of a bucket buffer: a bucket is compacted to its fill before its
/// collective, which then runs on this prefix only.
#[derive(Debug)]
struct Prefix<B> {
    buf: B,
    len: usize,
}

impl<T, B: AsMut<[T]>> AsMut<[T]> for Prefix<B> {
    fn as_mut(&mut self) -> &mut [T] {
        &mut self.buf.as_mut()[..self.len]
    }
}

/// Packs tensors into fixed-size buckets and runs `kind` on each; see the module docs.
/// `B` is the type of its two bucket buffers.
#[derive(Debug)]
pub struct Bucketer<'a, T: Element, B = Vec<T>> {
    comm: &'a Communicator,
    kind: BucketKind,
    segments: usize,
    seg_cap: usize,
    spare: Vec<B>,
    filling: Option<B>,
    fill: usize,
    items: Vec<Item>,
    in_flight: Option<InFlight<B>>,
    dests: VecDeque<Option<Dest<'a, T>>>,
    /// Id of `dests[0]`.
    base: u64,
    launched: u64,
}

/// Where `push` reads its input from.
enum Source<'s, T> {
    Slice(&'s [T]),
    Dest,
}

impl<'a, T: Element> Bucketer<'a, T> {
    /// A bucketer of two `bucket_bytes` buffers (allocated here, as `Vec`s) over `comm`.
    ///
    /// # Errors
    /// [`CommError::InvalidArgument`] when a bucket cannot hold one element per rank.
    pub fn new(comm: &'a Communicator, kind: BucketKind, bucket_bytes: usize) -> Result<Self> {
        let elems = bucket_bytes / std::mem::size_of::<T>();
        Self::with_buffers(
            comm,
            kind,
            [vec![T::default(); elems], vec![T::default(); elems]],
        )
    }
}

impl<'a, T: Element, B: AsMut<[T]> + Send + 'static> Bucketer<'a, T, B> {
    /// A bucketer over two caller-owned buffers of equal length (the bucket size), e.g.
    /// blocks lent by the rank's arena. Their contents are overwritten.
    ///
    /// # Errors
    /// [`CommError::InvalidArgument`] when the buffers differ in length or a bucket cannot
    /// hold one element per rank.
    pub fn with_buffers(
        comm: &'a Communicator,
        kind: BucketKind,
        mut buffers: [B; 2],
    ) -> Result<Self> {
        let segments = match kind {
            BucketKind::AllReduce(_) => 1,
            _ => comm.size(),
        };
        let [a, b] = &mut buffers;
        let (len, other) = (a.as_mut().len(), b.as_mut().len());
        if len != other {
            return Err(CommError::InvalidArgument {
                what: format!("bucket buffers of {len} and {other} elements"),
            });
        }
        let seg_cap = len / segments;
        if seg_cap == 0 {
            return Err(CommError::InvalidArgument {
                what: format!("bucket of {len} {} holds none per rank", T::DTYPE),
            });
        }
        let spare = buffers.into_iter().collect();
        Ok(Bucketer {
            comm,
            kind,
            segments,
            seg_cap,
            spare,
            filling: None,
            fill: 0,
            items: Vec::new(),
            in_flight: None,
            dests: VecDeque::new(),
            base: 0,
            launched: 0,
        })
    }

    /// Bytes of bucket memory held (two buffers), fixed for the bucketer's life.
    pub fn memory_bytes(&self) -> usize {
        2 * self.seg_cap * self.segments * std::mem::size_of::<T>()
    }

    /// Collectives launched so far.
    pub fn launched(&self) -> u64 {
        self.launched
    }

    /// Flushes and hands back the two buffers (to return them to an arena).
    ///
    /// # Errors
    /// As [`Bucketer::flush`]; a buffer lost to a failed collective is an error too.
    pub fn into_buffers(mut self) -> Result<Vec<B>> {
        self.flush()?;
        if self.spare.len() != 2 {
            return Err(CommError::InvalidArgument {
                what: "bucketer lost a buffer after a failed collective".into(),
            });
        }
        Ok(std::mem::take(&mut self.spare))
    }

    fn shard_len(&self, input: usize, output: usize) -> Result<usize> {
        let n = self.comm.size();
        let (shard, ok) = match self.kind {
            BucketKind::AllReduce(_) => (input, input == output),
            BucketKind::ReduceScatter(_) => (output, input == output * n),
            BucketKind::AllGather => (input, output == input * n),
        };
        if ok {
            Ok(shard)
        } else {
            Err(CommError::InvalidArgument {
                what: format!("bucket {:?}: input of {input} and output of {output} elements do not fit {n} ranks", self.kind),
            })
        }
    }

    /// Packs `input`; its result is written to `output` when its bucket completes (at the
    /// latest on [`Bucketer::flush`]). Lengths: all-reduce equal; reduce-scatter
    /// `input = N * output`; all-gather `output = N * input`.
    ///
    /// # Errors
    /// Wrong lengths, and any error of a collective launched or completed meanwhile.
    pub fn push(&mut self, input: &[T], output: &'a mut [T]) -> Result<()> {
        let shard = self.shard_len(input.len(), output.len())?;
        let id = self.register(Dest {
            out: output,
            shard,
            own: 0,
            pending: 0,
            packing: true,
        });
        self.pack(id, Source::Slice(input))
    }

    /// As [`Bucketer::push`] with NCCL's in-place layouts: the result of a reduce-scatter
    /// lands in chunk r of `buf`, an all-gather reads its input from chunk r of `buf`.
    ///
    /// # Errors
    /// As [`Bucketer::push`]; the length must be a multiple of N for reduce-scatter and
    /// all-gather.
    pub fn push_in_place(&mut self, buf: &'a mut [T]) -> Result<()> {
        let (n, r) = (self.comm.size(), self.comm.rank());
        let shard = match self.kind {
            BucketKind::AllReduce(_) => buf.len(),
            BucketKind::ReduceScatter(_) => self.shard_len(buf.len(), buf.len() / n)?,
            BucketKind::AllGather => self.shard_len(buf.len() / n, buf.len())?,
        };
        let own = if self.segments == 1 { 0 } else { r * shard };
        let id = self.register(Dest {
            out: buf,
            shard,
            own,
            pending: 0,
            packing: true,
        });
        self.pack(id, Source::Dest)
    }

    /// Launches the partly filled bucket and delivers every pending result.
    ///
    /// # Errors
    /// The first error of a collective.
    pub fn flush(&mut self) -> Result<()> {
        if self.fill > 0 {
            self.launch()?;
        }
        self.complete()
    }

    fn register(&mut self, d: Dest<'a, T>) -> u64 {
        self.dests.push_back(Some(d));
        self.base + self.dests.len() as u64 - 1
    }

    fn pack(&mut self, id: u64, src: Source<'_, T>) -> Result<()> {
        let idx = (id - self.base) as usize;
        let (shard, own) = match &self.dests[idx] {
            Some(d) => (d.shard, d.own),
            None => return Ok(()),
        };
        let r = self.comm.rank();
        let mut a = 0;
        while a < shard {
            if self.filling.is_none() {
                self.filling = Some(self.take_spare()?);
            }
            let p = (shard - a).min(self.seg_cap - self.fill);
            let Some(buf) = self.filling.as_mut() else {
                break;
            };
            let input: &[T] = match (&src, &self.dests[(id - self.base) as usize]) {
                (Source::Slice(s), _) => s,
                (Source::Dest, Some(d)) => d.out,
                (Source::Dest, None) => &[],
            };
            for j in 0..self.segments {
                let from = match self.kind {
                    BucketKind::AllReduce(_) => a,
                    BucketKind::ReduceScatter(_) => j * shard + a,
                    // Only our own segment carries data; the all-gather fills the others.
                    BucketKind::AllGather if j == r => own + a,
                    BucketKind::AllGather => continue,
                };
                let to = j * self.seg_cap + self.fill;
                buf.as_mut()[to..to + p].copy_from_slice(&input[from..from + p]);
            }
            self.items.push(Item {
                dest: id,
                a,
                p,
                at: self.fill,
            });
            if let Some(Some(d)) = self.dests.get_mut((id - self.base) as usize) {
                d.pending += 1;
            }
            self.fill += p;
            a += p;
            if self.fill == self.seg_cap {
                self.launch()?;
            }
        }
        if let Some(Some(d)) = self.dests.get_mut((id - self.base) as usize) {
            d.packing = false;
        }
        Ok(())
    }

    fn take_spare(&mut self) -> Result<B> {
        if self.spare.is_empty() {
            self.complete()?;
        }
        self.spare.pop().ok_or_else(|| CommError::InvalidArgument {
            what: "bucketer lost a buffer after a failed collective".into(),
        })
    }

    /// Starts the collective on the filling bucket (compacted to its fill), after completing
    /// the one in flight, so at most two buffers exist.
    fn launch(&mut self) -> Result<()> {
        let Some(mut buf) = self.filling.take() else {
            return Ok(());
        };
        let stride = self.fill;
        let slice = buf.as_mut();
        for j in 1..self.segments {
            slice.copy_within(j * self.seg_cap..j * self.seg_cap + stride, j * stride);
        }
        let buf = Prefix {
            buf,
            len: stride * self.segments,
        };
        let items = std::mem::take(&mut self.items);
        self.fill = 0;
        self.complete()?;
        let call = match self.kind {
            BucketKind::AllReduce(op) => Collective::AllReduce(op),
            BucketKind::ReduceScatter(op) => Collective::ReduceScatter(op),
            BucketKind::AllGather => Collective::AllGather,
        };
        let work = match call {
            Collective::AllReduce(op) => self.comm.all_reduce_async(buf, op),
            Collective::ReduceScatter(op) => self.comm.reduce_scatter_async(buf, op),
            _ => self.comm.all_gather_async(buf),
        };
        self.launched += 1;
        self.in_flight = Some(InFlight {
            work,
            items,
            stride,
        });
        Ok(())
    }

    /// Waits for the bucket in flight and copies its results out.
    fn complete(&mut self) -> Result<()> {
        let Some(f) = self.in_flight.take() else {
            return Ok(());
        };
        let Prefix { mut buf, .. } = f.work.wait()?;
        let r = self.comm.rank();
        let out = buf.as_mut();
        for it in &f.items {
            let Some(Some(d)) = self.dests.get_mut((it.dest - self.base) as usize) else {
                continue;
            };
            match self.kind {
                BucketKind::AllReduce(_) => {
                    d.out[it.a..it.a + it.p].copy_from_slice(&out[it.at..it.at + it.p]);
                }
                BucketKind::ReduceScatter(_) => {
                    let from = r * f.stride + it.at;
                    d.out[d.own + it.a..d.own + it.a + it.p]
                        .copy_from_slice(&out[from..from + it.p]);
                }
                BucketKind::AllGather => {
                    for j in 0..self.segments {
                        let (from, to) = (j * f.stride + it.at, j * d.shard + it.a);
                        d.out[to..to + it.p].copy_from_slice(&out[from..from + it.p]);
                    }
                }
            }
            d.pending -= 1;
        }
        // Release finished tensors at the front so the table stays bounded.
        while let Some(Some(d)) = self.dests.front() {
            if d.pending > 0 || d.packing {
                break;
            }
            self.dests.pop_front();
            self.base += 1;
        }
        self.spare.push(buf);
        Ok(())
    }
}
