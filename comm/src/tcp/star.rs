//! The star exchange every collective is built from: each rank sends one frame to rank 0,
//! rank 0 checks them all (same sequence number and descriptor, expected length), and answers
//! each rank with one frame: its result, or a notice of why the collective failed.
//!
//! Once a collective fails on a rank, the rank's [`Net`] is poisoned: it closes its sending
//! side (peers then read end-of-stream instead of waiting) and refuses every later collective
//! with the first cause.

use std::net::{Shutdown, TcpStream};
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::error::{BreakCause, CommError, Result};
use crate::op::OpDesc;

use super::notice::Notice;
use super::wire::{self, IoFail, Status, MAX_ERROR_BYTES};

/// How many payload bytes a frame may carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LenRule {
    Exact(usize),
    AtMost(usize),
}

impl LenRule {
    fn admits(self, len: u64) -> Option<usize> {
        let len = usize::try_from(len).ok()?;
        match self {
            LenRule::Exact(n) => (len == n).then_some(len),
            LenRule::AtMost(n) => (len <= n).then_some(len),
        }
    }
}

/// Where rank j's payload goes in rank 0's gather buffer, and how long it may be; `None` when
/// the descriptor's sizes overflow.
pub(crate) type Place<'a> = &'a dyn Fn(&OpDesc, usize) -> Option<(usize, LenRule)>;

/// One rank's sockets and failure state.
#[derive(Debug)]
pub(crate) struct Net {
    pub rank: usize,
    pub size: usize,
    pub config: Config,
    /// Rank 0: the stream to rank j at index j - 1. Other ranks: the stream to rank 0.
    pub links: Vec<TcpStream>,
    poison: Option<BreakCause>,
}

/// Deadline of one collective on this rank.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Round {
    start: Instant,
    deadline: Instant,
}

impl Net {
    pub(crate) fn new(rank: usize, size: usize, config: Config, links: Vec<TcpStream>) -> Net {
        Net {
            rank,
            size,
            config,
            links,
            poison: None,
        }
    }

    fn broken(&self, desc: &OpDesc, cause: BreakCause) -> CommError {
        CommError::Broken {
            op: desc.kind,
            seq: desc.seq,
            bytes: desc.bytes(),
            rank: self.rank,
            cause,
            history: Box::default(),
        }
    }

    fn timeout(&self, desc: &OpDesc, round: Round, missing: Vec<usize>) -> CommError {
        CommError::Timeout {
            op: desc.kind,
            seq: desc.seq,
            bytes: desc.bytes(),
            rank: self.rank,
            waited: round.start.elapsed(),
            missing,
            history: Box::default(),
        }
    }

    /// Starts a collective: refuses it on a poisoned group, else fixes its deadline.
    pub(crate) fn begin(&self, desc: &OpDesc) -> Result<Round> {
        if let Some(cause) = &self.poison {
            return Err(self.broken(desc, cause.clone()));
        }
        let start = Instant::now();
        Ok(Round {
            start,
            deadline: start + self.config.timeout,
        })
    }

    /// Records the first failure and closes our sending side of every link.
    fn poison(&mut self, cause: BreakCause) {
        for link in &self.links {
            // Already-closed sockets report an error here; there is nothing left to close.
            let _ = link.shutdown(Shutdown::Write);
        }
        self.poison.get_or_insert(cause);
    }

    fn cause_of(&self, peer: usize, desc: &OpDesc, fail: &IoFail) -> BreakCause {
        match fail {
            IoFail::TimedOut => BreakCause::TimedOut {
                rank: self.rank,
                seq: desc.seq,
            },
            IoFail::Closed => BreakCause::Left { rank: peer },
            IoFail::Other(e) => BreakCause::Failed {
                rank: peer,
                what: format!("connection error: {e}"),
            },
            IoFail::Malformed(m) => BreakCause::Failed {
                rank: peer,
                what: format!("malformed frame: {m}"),
            },
        }
    }

    /// Any rank but 0: sends this rank's frame.
    pub(crate) fn leaf_send(&mut self, desc: &OpDesc, round: Round, payload: &[u8]) -> Result<()> {
        let sent = match self.links.first_mut() {
            Some(link) => wire::write_frame(link, desc, Status::Ok, payload, round.deadline),
            None => Err(IoFail::Closed),
        };
        sent.map_err(|fail| self.leaf_failed(desc, round, &fail))
    }

    /// Any rank but 0: reads rank 0's answer into `into` and returns its length.
    pub(crate) fn leaf_receive(
        &mut self,
        desc: &OpDesc,
        round: Round,
        rule: LenRule,
        into: &mut [u8],
    ) -> Result<usize> {
        let got = match self.links.first_mut() {
            Some(link) => read_answer(link, desc, round, rule, into),
            None => Err(IoFail::Closed),
        };
        match got {
            Ok(Ok(len)) => Ok(len),
            Ok(Err(notice)) => Err(self.noticed(desc, notice)),
            Err(fail) => Err(self.leaf_failed(desc, round, &fail)),
        }
    }

    fn leaf_failed(&mut self, desc: &OpDesc, round: Round, fail: &IoFail) -> CommError {
        let cause = self.cause_of(0, desc, fail);
        self.poison(cause.clone());
        match fail {
            // Rank 0 waits for everyone, so this rank cannot tell who is late.
            IoFail::TimedOut => self.timeout(desc, round, Vec::new()),
            _ => self.broken(desc, cause),
        }
    }

    /// The error a notice from rank 0 stands for on this rank.
    fn noticed(&mut self, desc: &OpDesc, notice: Notice) -> CommError {
        match notice {
            Notice::Mismatch { peer, desc: theirs } => {
                self.poison(BreakCause::Mismatch { seq: desc.seq });
                mismatch(self.rank, desc, peer, &theirs)
            }
            Notice::Cause(cause) => {
                self.poison(cause.clone());
                self.broken(desc, cause)
            }
        }
    }

    /// Rank 0: reads every other rank's frame; rank j's payload lands in `buf` where `place`
    /// says. Returns the payload lengths by rank (index 0, rank 0's own, is 0).
    pub(crate) fn gather(
        &mut self,
        desc: &OpDesc,
        round: Round,
        buf: &mut [u8],
        place: Place<'_>,
    ) -> Result<Vec<usize>> {
        let mut descs = vec![*desc; self.size];
        let mut lens = vec![0; self.size];
        let mut mismatched = false;
        for j in 1..self.size {
            let link = &mut self.links[j - 1];
            match read_contribution(link, desc, round, j, buf, place, mismatched) {
                Ok((theirs, len)) => {
                    mismatched |= desc.first_difference(&theirs).is_some();
                    (descs[j], lens[j]) = (theirs, len);
                }
                Err(fail) => return Err(self.hub_failed(desc, round, j, &fail)),
            }
        }
        if mismatched {
            return Err(self.hub_mismatch(desc, round, &descs));
        }
        Ok(lens)
    }

    /// Rank 0: sends rank j (for every j > 0) the frame `payload(j)`.
    pub(crate) fn reply<'b>(
        &mut self,
        desc: &OpDesc,
        payload: &dyn Fn(usize) -> &'b [u8],
    ) -> Result<()> {
        let round = self.begin(desc)?;
        for j in 1..self.size {
            let link = &mut self.links[j - 1];
            if let Err(fail) = wire::write_frame(link, desc, Status::Ok, payload(j), round.deadline)
            {
                return Err(self.hub_failed(desc, round, j, &fail));
            }
        }
        Ok(())
    }

    /// Rank 0 could not talk to rank `peer`: tells every other rank why, then fails.
    fn hub_failed(&mut self, desc: &OpDesc, round: Round, peer: usize, fail: &IoFail) -> CommError {
        let cause = self.cause_of(peer, desc, fail);
        let notice = Notice::Cause(cause.clone()).encode();
        let deadline = Instant::now() + self.config.timeout;
        for (i, link) in self.links.iter_mut().enumerate() {
            if i + 1 != peer {
                // Best effort: a rank we cannot reach finds out when the link closes.
                let _ = wire::write_frame(link, desc, Status::Error, &notice, deadline);
            }
        }
        let missing = match fail {
            IoFail::TimedOut => self.late_from(peer),
            _ => Vec::new(),
        };
        self.poison(cause.clone());
        match fail {
            IoFail::TimedOut => self.timeout(desc, round, missing),
            _ => self.broken(desc, cause),
        }
    }

    /// `peer` and every later rank that has sent nothing yet.
    fn late_from(&self, peer: usize) -> Vec<usize> {
        let mut late = vec![peer];
        for j in peer + 1..self.size {
            let link = &self.links[j - 1];
            let mut byte = [0u8; 1];
            let pending = link.set_nonblocking(true).is_ok()
                && matches!(link.peek(&mut byte), Ok(n) if n > 0);
            let _ = link.set_nonblocking(false);
            if !pending {
                late.push(j);
            }
        }
        late
    }

    /// Rank 0 saw different calls: each rank learns of a peer whose call differs from its own.
    fn hub_mismatch(&mut self, desc: &OpDesc, round: Round, descs: &[OpDesc]) -> CommError {
        let differing = |mine: &OpDesc| {
            descs
                .iter()
                .position(|d| d.first_difference(mine).is_some())
                .unwrap_or(0)
        };
        for j in 1..self.size {
            let peer = differing(&descs[j]);
            let notice = Notice::Mismatch {
                peer,
                desc: descs[peer],
            };
            let link = &mut self.links[j - 1];
            let _ = wire::write_frame(link, desc, Status::Error, &notice.encode(), round.deadline);
        }
        self.poison(BreakCause::Mismatch { seq: desc.seq });
        let peer = differing(desc);
        mismatch(self.rank, desc, peer, &descs[peer])
    }
}

/// The longest a poisoned rank waits on drop for its peers to close their side.
const LINGER: Duration = Duration::from_secs(2);

impl Drop for Net {
    /// A failed collective can leave peers' frames unread in our sockets, and closing a socket
    /// with unread data resets the connection, which can destroy the notice we sent before
    /// the peer reads it. So a poisoned rank reads until its peers close (they do as soon as
    /// they read the notice), for at most [`LINGER`].
    fn drop(&mut self) {
        if self.poison.is_none() {
            return;
        }
        let deadline = Instant::now() + LINGER.min(self.config.timeout);
        for link in &mut self.links {
            let _ = wire::drain(link, u64::MAX, deadline);
        }
    }
}

fn mismatch(rank: usize, mine: &OpDesc, peer: usize, theirs: &OpDesc) -> CommError {
    let (field, value, peer_value) = mine.first_difference(theirs).unwrap_or((
        "seq",
        mine.seq.to_string(),
        theirs.seq.to_string(),
    ));
    CommError::Mismatch {
        seq: mine.seq,
        field,
        rank,
        value,
        peer,
        peer_value,
        history: Box::default(),
    }
}

/// Rank 0 reads rank j's frame. A frame whose call differs from ours (or any frame after such
/// a one) is drained, not stored: the collective will fail, but the sender must not block.
fn read_contribution(
    link: &mut TcpStream,
    desc: &OpDesc,
    round: Round,
    j: usize,
    buf: &mut [u8],
    place: Place<'_>,
    drain: bool,
) -> Result<(OpDesc, usize), IoFail> {
    let h = wire::read_header(link, round.deadline)?;
    if h.status != Status::Ok {
        return Err(IoFail::Malformed("an error frame sent to rank 0".into()));
    }
    if h.desc.seq != desc.seq {
        let what = format!("frame of op #{} during op #{}", h.desc.seq, desc.seq);
        return Err(IoFail::Malformed(what));
    }
    let differs = drain || desc.first_difference(&h.desc).is_some();
    let (at, rule) = place(if differs { &h.desc } else { desc }, j)
        .ok_or_else(|| IoFail::Malformed(format!("sizes of {:?} overflow", h.desc)))?;
    let len = rule
        .admits(h.len)
        .ok_or_else(|| IoFail::Malformed(format!("{} payload bytes, expected {rule:?}", h.len)))?;
    if differs {
        wire::drain(link, h.len, round.deadline)?;
    } else {
        let end = at.checked_add(len).filter(|&e| e <= buf.len());
        let end = end.ok_or_else(|| IoFail::Malformed("payload past the buffer".into()))?;
        wire::read_full(link, &mut buf[at..end], round.deadline)?;
    }
    Ok((h.desc, len))
}

/// A non-zero rank reads rank 0's answer: `Ok(Ok(len))` for data in `into`, `Ok(Err(_))` for
/// a notice of failure.
fn read_answer(
    link: &mut TcpStream,
    desc: &OpDesc,
    round: Round,
    rule: LenRule,
    into: &mut [u8],
) -> Result<std::result::Result<usize, Notice>, IoFail> {
    let h = wire::read_header(link, round.deadline)?;
    // A notice carries rank 0's call, which may differ from ours (that is the mismatch).
    let same_call = h.desc.kind == desc.kind || h.status == Status::Error;
    if h.desc.seq != desc.seq || !same_call {
        let what = format!(
            "answer for {} #{} during {} #{}",
            h.desc.kind, h.desc.seq, desc.kind, desc.seq
        );
        return Err(IoFail::Malformed(what));
    }
    if h.status == Status::Error {
        let len = LenRule::AtMost(MAX_ERROR_BYTES).admits(h.len);
        let len =
            len.ok_or_else(|| IoFail::Malformed(format!("error frame of {} bytes", h.len)))?;
        let mut text = vec![0u8; len];
        wire::read_full(link, &mut text, round.deadline)?;
        return Notice::decode(&text).map(Err).map_err(IoFail::Malformed);
    }
    let len = rule
        .admits(h.len)
        .filter(|&l| l <= into.len())
        .ok_or_else(|| IoFail::Malformed(format!("{} payload bytes, expected {rule:?}", h.len)))?;
    wire::read_full(link, &mut into[..len], round.deadline)?;
    Ok(Ok(len))
}
