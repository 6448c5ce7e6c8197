//! Which bytes NCCL touches: the checked plan of one collective on one rank.
//!
//! This is where the soundness argument's bound (S3 in `mod.rs`) is established: given the
//! element lengths of the caller's buffers, [`plan`] either rejects the call or returns NCCL's
//! count and the element offsets of its send and receive pointers such that NCCL reads and
//! writes only inside those buffers. In-place forms use NCCL's layouts: reduce-scatter leaves
//! rank r's chunk at `r * count` of the buffer, all-gather reads rank r's input from there.

use crate::communicator::Collective;
use crate::error::{CommError, Result};

/// Where one of NCCL's two pointers points.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    /// `offset` elements into the send buffer.
    Send(usize),
    /// `offset` elements into the receive (or in-place) buffer.
    Recv(usize),
    /// A null pointer (an ignored argument: broadcast's send off the root, reduce's receive
    /// off the root).
    Null,
}

/// One rank's launch of one collective.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Launch {
    /// The count NCCL takes (per-rank chunk for reduce-scatter and all-gather).
    pub count: usize,
    /// Elements of the whole array, as every rank's `OpDesc` reports it.
    pub whole: usize,
    /// NCCL's `sendbuff`.
    pub send: Side,
    /// NCCL's `recvbuff`.
    pub recv: Side,
}

fn length(call: Collective, what: &'static str, expected: usize, got: usize) -> Result<()> {
    if expected == got {
        return Ok(());
    }
    Err(CommError::Length {
        op: call.kind(),
        what,
        expected,
        got,
    })
}

fn required(call: Collective, what: &'static str, len: Option<usize>) -> Result<usize> {
    len.ok_or_else(|| CommError::InvalidArgument {
        what: format!(
            "{}: the {what} buffer is required on this rank",
            call.kind()
        ),
    })
}

/// Plans `call` on `rank` of `size`. `in_place` takes the buffer as `recv` (then `send` is
/// `None`); out of place, `send`/`recv` are the buffers' lengths, `None` where the caller
/// passed none (allowed only where NCCL ignores the argument).
///
/// # Errors
/// [`CommError::Length`], [`CommError::Root`] or [`CommError::InvalidArgument`] when the
/// buffers do not fit the call; nothing is launched then.
pub(crate) fn plan(
    call: Collective,
    rank: usize,
    size: usize,
    in_place: bool,
    send: Option<usize>,
    recv: Option<usize>,
) -> Result<Launch> {
    let root = match call {
        Collective::Broadcast(root) | Collective::Reduce(_, root) => Some(root),
        _ => None,
    };
    if let Some(root) = root.filter(|&r| r >= size) {
        let op = call.kind();
        return Err(CommError::Root { op, root, size });
    }
    if in_place {
        let n = required(call, "in-place", recv)?;
        return plan_in_place(call, rank, size, n);
    }
    plan_out_of_place(call, root == Some(rank), size, send, recv)
}

fn at(count: usize, whole: usize, send: Side, recv: Side) -> Launch {
    Launch {
        count,
        whole,
        send,
        recv,
    }
}

/// The per-rank chunk of an array of `len` elements split over `size` ranks.
fn chunk(call: Collective, len: usize, size: usize) -> Result<usize> {
    if len % size == 0 {
        return Ok(len / size);
    }
    let expected = len.div_ceil(size) * size;
    length(
        call,
        "array (not a multiple of the group size)",
        expected,
        len,
    )
    .map(|()| 0)
}

/// `call` on one buffer of `n` elements, in NCCL's in-place layouts.
fn plan_in_place(call: Collective, rank: usize, size: usize, n: usize) -> Result<Launch> {
    Ok(match call {
        Collective::ReduceScatter(_) => {
            let c = chunk(call, n, size)?;
            at(c, n, Side::Recv(0), Side::Recv(rank * c))
        }
        Collective::AllGather => {
            let c = chunk(call, n, size)?;
            at(c, n, Side::Recv(rank * c), Side::Recv(0))
        }
        _ => at(n, n, Side::Recv(0), Side::Recv(0)),
    })
}

/// `call` from a send buffer into a receive buffer (either absent where NCCL ignores it).
fn plan_out_of_place(
    call: Collective,
    is_root: bool,
    size: usize,
    send: Option<usize>,
    recv: Option<usize>,
) -> Result<Launch> {
    let times = |n: usize| {
        n.checked_mul(size)
            .ok_or_else(|| CommError::InvalidArgument {
                what: format!("{}: {n} x {size} elements overflow", call.kind()),
            })
    };
    match call {
        Collective::AllReduce(_) => {
            let (s, r) = (required(call, "send", send)?, required(call, "recv", recv)?);
            length(call, "recv", s, r).map(|()| at(s, s, Side::Send(0), Side::Recv(0)))
        }
        Collective::ReduceScatter(_) => {
            let (s, r) = (required(call, "send", send)?, required(call, "recv", recv)?);
            length(call, "send", times(r)?, s).map(|()| at(r, s, Side::Send(0), Side::Recv(0)))
        }
        Collective::AllGather => {
            let (s, r) = (required(call, "send", send)?, required(call, "recv", recv)?);
            length(call, "recv", times(s)?, r).map(|()| at(s, r, Side::Send(0), Side::Recv(0)))
        }
        Collective::Broadcast(_) => {
            let r = required(call, "recv", recv)?;
            if !is_root {
                return Ok(at(r, r, Side::Null, Side::Recv(0)));
            }
            let s = required(call, "send", send)?;
            length(call, "send", r, s).map(|()| at(r, r, Side::Send(0), Side::Recv(0)))
        }
        Collective::Reduce(..) => {
            let s = required(call, "send", send)?;
            if !is_root {
                return Ok(at(s, s, Side::Send(0), Side::Null));
            }
            let r = required(call, "recv", recv)?;
            length(call, "recv", s, r).map(|()| at(s, s, Side::Send(0), Side::Recv(0)))
        }
    }
}

#[cfg(test)]
#[path = "layout_tests.rs"]
mod tests;
