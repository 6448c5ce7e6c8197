//! Step 1 of the protocol in `mod.rs`: checks a call's buffer lengths against NCCL's
//! layouts and describes the call, before any exchange with the peers.

use super::RawBuf;
use crate::communicator::{length, Collective};
use crate::dtype::DType;
use crate::error::{CommError, Result};
use crate::op::{OpDesc, OpKind};

fn multiple_of_size(op: OpKind, len: usize, size: usize) -> Result<()> {
    if len % size == 0 {
        Ok(())
    } else {
        Err(CommError::InvalidArgument {
            what: format!(
                "{op}: in-place buffer of {len} elements is not a multiple of {size} ranks"
            ),
        })
    }
}

fn too_long(op: OpKind) -> CommError {
    CommError::InvalidArgument {
        what: format!("{op}: the whole array's length overflows usize"),
    }
}

/// Step 1: checks the lengths against NCCL's layout and describes the call.
pub(super) fn describe(
    call: Collective,
    dtype: DType,
    seq: u64,
    size: usize,
    send: Option<RawBuf>,
    recv: RawBuf,
) -> Result<OpDesc> {
    let op = call.kind();
    let per_rank = |len: usize| len.checked_mul(size).ok_or_else(|| too_long(op));
    let (count, root, redop) = match (call, send) {
        (Collective::AllReduce(r), None) => (recv.len, None, Some(r)),
        (Collective::AllReduce(r), Some(s)) => {
            length(op, "recv", s.len, recv.len)?;
            (recv.len, None, Some(r))
        }
        (Collective::ReduceScatter(r), None) => {
            multiple_of_size(op, recv.len, size)?;
            (recv.len, None, Some(r))
        }
        (Collective::ReduceScatter(r), Some(s)) => {
            length(op, "send", per_rank(recv.len)?, s.len)?;
            (s.len, None, Some(r))
        }
        (Collective::AllGather, None) => {
            multiple_of_size(op, recv.len, size)?;
            (recv.len, None, None)
        }
        (Collective::AllGather, Some(s)) => {
            length(op, "recv", per_rank(s.len)?, recv.len)?;
            (recv.len, None, None)
        }
        (Collective::Broadcast(root), send) => {
            if root >= size {
                return Err(CommError::Root { op, root, size });
            }
            if let Some(s) = send {
                length(op, "send", recv.len, s.len)?;
            }
            (recv.len, Some(root), None)
        }
        (Collective::Reduce(..), _) => {
            return Err(CommError::Unsupported {
                backend: "device_local",
                what: "reduce (use all-reduce or reduce-scatter)".into(),
            })
        }
    };
    if redop.is_some() && !matches!(dtype, DType::F32 | DType::Bf16 | DType::F16) {
        return Err(super::ops::no_reduction(dtype));
    }
    count
        .checked_mul(dtype.size())
        .ok_or_else(|| too_long(op))?;
    Ok(OpDesc {
        seq,
        kind: op,
        dtype: Some(dtype),
        count,
        root,
        op: redop,
    })
}
