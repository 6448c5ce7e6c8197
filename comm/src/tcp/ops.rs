//! The collectives as star exchanges. Every rank sends its input to rank 0; rank 0 computes
//! the whole result with the crate's rank-order kernel ([`reduce_slices`]) and answers each
//! rank with the part it keeps, which it writes straight into the caller's buffer.
//!
//! Rank 0 stages the inputs of every rank (`gathered`) and, for reduce-scatter and a reduce
//! rooted elsewhere, the reduced array (`out`), in 8-byte words so that every element type's
//! view of them is aligned.

use crate::dtype::{BufMut, BufRef, DType};
use crate::element::Element;
use crate::error::{CommError, Result};
use crate::op::{OpDesc, OpKind};
use crate::reduce_op::{reduce_slices, ReduceOp};
use crate::with_element;

use super::star::{LenRule, Net};

/// Rank 0's heap buffers, kept across collectives at their high-water mark.
#[derive(Debug, Default)]
pub(crate) struct Stage {
    gathered: Vec<u64>,
    out: Vec<u64>,
}

impl Stage {
    /// Bytes held.
    pub(crate) fn bytes(&self) -> u64 {
        ((self.gathered.capacity() + self.out.capacity()) * 8) as u64
    }
}

/// `bytes` bytes of `v` (grown with zeros as needed).
fn words(v: &mut Vec<u64>, bytes: usize) -> &mut [u8] {
    let n = bytes.div_ceil(8);
    if v.len() < n {
        v.resize(n, 0);
    }
    &mut bytemuck::cast_slice_mut(v.as_mut_slice())[..bytes]
}

fn too_big(desc: &OpDesc) -> CommError {
    CommError::InvalidArgument {
        what: format!(
            "tcp: {} of {} elements: sizes overflow",
            desc.kind, desc.count
        ),
    }
}

/// Bytes of `elems` elements of the call's dtype.
pub(crate) fn bytes_of_elems(desc: &OpDesc, elems: usize) -> Option<usize> {
    elems.checked_mul(desc.dtype.map_or(0, DType::size))
}

/// What rank `j` sends for `desc` in a group of `size`, and where rank 0 stores it:
/// the whole array (reductions), one chunk (all-gather), the array from the root only
/// (broadcast), nothing (barrier).
pub(crate) fn contribution(desc: &OpDesc, size: usize, j: usize) -> Option<(usize, LenRule)> {
    let whole = bytes_of_elems(desc, desc.count)?;
    let per = bytes_of_elems(desc, desc.count / size.max(1))?;
    Some(match desc.kind {
        OpKind::AllReduce | OpKind::ReduceScatter | OpKind::Reduce => {
            (j.checked_mul(whole)?, LenRule::Exact(whole))
        }
        OpKind::AllGather => (j.checked_mul(per)?, LenRule::Exact(per)),
        OpKind::Broadcast if desc.root == Some(j) => (0, LenRule::Exact(whole)),
        OpKind::Broadcast | OpKind::Barrier | OpKind::Split => (0, LenRule::Exact(0)),
    })
}

fn bytes_ref<'a>(b: &'a BufRef<'_>) -> &'a [u8] {
    b.as_bytes()
}

pub(crate) fn bytes_mut<'a>(b: &'a mut BufMut<'_>) -> &'a mut [u8] {
    b.as_bytes_mut()
}

fn reduce_typed<T: Element>(
    inputs: &[u8],
    out: &mut [u8],
    ranks: usize,
    op: ReduceOp,
) -> Option<()> {
    let out: &mut [T] = bytemuck::try_cast_slice_mut(out).ok()?;
    let all: &[T] = bytemuck::try_cast_slice(inputs).ok()?;
    if out.is_empty() {
        return Some(());
    }
    let parts: Vec<&[T]> = all.chunks_exact(out.len()).take(ranks).collect();
    (parts.len() == ranks).then(|| reduce_slices(out, &parts, op))
}

/// Reduces the `ranks` consecutive equal arrays of `inputs` into `out`, in rank order.
fn reduce_bytes(
    desc: &OpDesc,
    inputs: &[u8],
    out: &mut [u8],
    ranks: usize,
    op: ReduceOp,
) -> Result<()> {
    // Peers' frames must carry this rank's (dtype, redop), which its communicator checked;
    // checking again keeps the kernel's contract (no avg on integers) visible here.
    let dtype = desc.dtype.unwrap_or(DType::F32);
    op.check(desc.kind, dtype)?;
    let done = with_element!(dtype, T => reduce_typed::<T>(inputs, out, ranks, op));
    done.ok_or_else(|| CommError::InvalidArgument {
        what: "tcp: staged buffers are misaligned or short (a bug)".into(),
    })
}

/// One collective on one rank: the call, the caller's buffers and this rank's input bytes.
pub(crate) struct Call<'a, 'b> {
    pub desc: &'a OpDesc,
    pub send: Option<BufRef<'b>>,
    pub recv: BufMut<'b>,
}

impl Call<'_, '_> {
    /// This rank's input: `send`, or in place the part of `recv` the call reads.
    fn input(&mut self, net: &Net) -> Result<&[u8]> {
        let (at, rule) =
            contribution(self.desc, net.size, net.rank).ok_or_else(|| too_big(self.desc))?;
        let LenRule::Exact(len) = rule else {
            return Ok(&[]);
        };
        if let Some(s) = &self.send {
            return Ok(&bytes_ref(s)[..len.min(bytes_ref(s).len())]);
        }
        // In place, all-gather reads chunk r; the others read the buffer from its start.
        let at = if self.desc.kind == OpKind::AllGather {
            at
        } else {
            0
        };
        let recv: &[u8] = bytes_mut(&mut self.recv);
        recv.get(at..at + len).ok_or_else(|| too_big(self.desc))
    }

    /// Where this rank's result goes in `recv` (byte range), and its length.
    fn output(&self, net: &Net) -> Option<(usize, usize)> {
        let d = self.desc;
        let whole = bytes_of_elems(d, d.count)?;
        let per = bytes_of_elems(d, d.count / net.size)?;
        Some(match d.kind {
            OpKind::ReduceScatter if self.send.is_none() => (net.rank.checked_mul(per)?, per),
            OpKind::ReduceScatter => (0, per),
            OpKind::Reduce if d.root != Some(net.rank) => (0, 0),
            OpKind::Barrier | OpKind::Split => (0, 0),
            _ => (0, whole),
        })
    }
}

/// Runs `call` on a rank other than 0.
pub(crate) fn leaf(net: &mut Net, mut call: Call<'_, '_>) -> Result<()> {
    let desc = *call.desc;
    let round = net.begin(&desc)?;
    let input = call.input(net)?;
    net.leaf_send(&desc, round, input)?;
    let (at, len) = call.output(net).ok_or_else(|| too_big(&desc))?;
    let recv = bytes_mut(&mut call.recv);
    let into = recv.get_mut(at..at + len).ok_or_else(|| too_big(&desc))?;
    net.leaf_receive(&desc, round, LenRule::Exact(len), into)?;
    Ok(())
}

/// Runs `call` on rank 0: gathers every input, computes, answers, keeps its own part.
pub(crate) fn hub(
    net: &mut Net,
    stage: &mut Stage,
    mut call: Call<'_, '_>,
    op: Option<ReduceOp>,
) -> Result<()> {
    let desc = *call.desc;
    let size = net.size;
    let round = net.begin(&desc)?;
    let place = |d: &OpDesc, j: usize| contribution(d, size, j);
    let mut total = 0usize;
    for j in 0..size {
        let (at, rule) = place(&desc, j).ok_or_else(|| too_big(&desc))?;
        let (LenRule::Exact(len) | LenRule::AtMost(len)) = rule;
        total = total.max(at.checked_add(len).ok_or_else(|| too_big(&desc))?);
    }
    let gathered = words(&mut stage.gathered, total);
    {
        let input = call.input(net)?;
        let (at, _) = place(&desc, 0).ok_or_else(|| too_big(&desc))?;
        gathered[at..at + input.len()].copy_from_slice(input);
    }
    net.gather(&desc, round, gathered, &place)?;
    let whole = bytes_of_elems(&desc, desc.count).ok_or_else(|| too_big(&desc))?;
    let redop = op.unwrap_or(ReduceOp::Sum);
    match desc.kind {
        OpKind::AllReduce => {
            let recv = bytes_mut(&mut call.recv);
            reduce_bytes(&desc, gathered, &mut recv[..whole], size, redop)?;
            let recv: &[u8] = recv;
            net.reply(&desc, &|_| recv)
        }
        OpKind::ReduceScatter => {
            let per = whole / size;
            let out = words(&mut stage.out, whole);
            reduce_bytes(&desc, gathered, out, size, redop)?;
            // Rank 0's chunk starts at 0 both in place and out of place.
            bytes_mut(&mut call.recv)[..per].copy_from_slice(&out[..per]);
            let out: &[u8] = out;
            net.reply(&desc, &|j| &out[j * per..(j + 1) * per])
        }
        OpKind::AllGather | OpKind::Broadcast => {
            // `gathered` holds the concatenated chunks, or the root's array at 0.
            let recv = bytes_mut(&mut call.recv);
            recv[..whole].copy_from_slice(&gathered[..whole]);
            let recv: &[u8] = recv;
            net.reply(&desc, &|_| &recv[..whole])
        }
        OpKind::Reduce => {
            let root = desc.root.unwrap_or(0);
            if root == 0 {
                let recv = bytes_mut(&mut call.recv);
                reduce_bytes(&desc, gathered, &mut recv[..whole], size, redop)?;
                return net.reply(&desc, &|_| &[]);
            }
            let out = words(&mut stage.out, whole);
            reduce_bytes(&desc, gathered, out, size, redop)?;
            let out: &[u8] = out;
            net.reply(&desc, &|j| if j == root { out } else { &[] })
        }
        OpKind::Barrier | OpKind::Split => net.reply(&desc, &|_| &[]),
    }
}
