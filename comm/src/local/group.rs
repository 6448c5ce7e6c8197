//! The shared state of a local group and the entry/exit protocol every collective follows.
//!
//! Protocol for the collective with sequence number s on rank r:
//! 1. publish (descriptor, send address, recv address) in slot r;
//! 2. entry wait: after it, every slot holds the descriptors of op s;
//! 3. compare all descriptors (every rank sees the same table, so all agree on a mismatch);
//! 4. run the phases, separated by committed waits; each phase reads peers' buffers only in
//!    ranges no rank writes during that phase;
//! 5. exit wait: after it no peer touches this rank's buffers, so the call may return.

use std::sync::{Arc, Mutex, PoisonError};

use crate::backend::Leave;
use crate::config::Config;
use crate::error::{BreakCause, CommError, Result};
use crate::op::OpDesc;

use super::barrier::{Barrier, BarrierError, Wait};

/// A buffer address published to peers. Stored as an integer: peers turn it back into a
/// pointer only between the waits that bracket the owner's call (see the module docs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Addr(pub usize);

/// What rank r publishes for one collective.
#[derive(Debug, Clone, Default)]
pub(crate) struct Slot {
    pub desc: Option<OpDesc>,
    pub send: Addr,
    pub recv: Addr,
    /// True for the in-place form (then `send` points into `recv`).
    pub in_place: bool,
    /// (color, key) of a split.
    pub split: (u32, u32),
    /// The new group a split leader created, for its members to pick up.
    pub child: Option<Arc<Group>>,
}

/// The state all ranks of one local group share.
#[derive(Debug)]
pub(crate) struct Group {
    pub size: usize,
    pub config: Config,
    pub barrier: Barrier,
    slots: Vec<Mutex<Slot>>,
}

impl Group {
    pub fn new(size: usize, config: Config) -> Self {
        Group {
            size,
            config,
            barrier: Barrier::new(size),
            slots: (0..size).map(|_| Mutex::new(Slot::default())).collect(),
        }
    }

    pub fn publish(&self, rank: usize, f: impl FnOnce(&mut Slot)) {
        // A slot is plain data rewritten whole by its owner; poisoning cannot tear it.
        f(&mut self.slots[rank]
            .lock()
            .unwrap_or_else(PoisonError::into_inner));
    }

    pub fn read(&self, rank: usize) -> Slot {
        self.slots[rank]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// Rank `rank`'s handle on a group: what `Drop` of a communicator uses to leave.
#[derive(Debug)]
pub(crate) struct Member {
    pub rank: usize,
    pub group: Arc<Group>,
}

impl Leave for Member {
    fn leave(&self, panicked: bool) {
        let rank = self.rank;
        let cause = if panicked {
            BreakCause::Panicked { rank }
        } else {
            BreakCause::Left { rank }
        };
        self.group.barrier.leave(rank, cause);
    }
}

/// The addresses a rank publishes for one call.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Io {
    pub send: Addr,
    pub recv: Addr,
    pub in_place: bool,
}

/// One rank's view during a collective: the peers' published slots.
pub(crate) struct Entered {
    pub slots: Vec<Slot>,
}

impl Member {
    fn to_error(&self, desc: &OpDesc, e: BarrierError) -> CommError {
        match e {
            BarrierError::Timeout { missing, waited } => CommError::Timeout {
                op: desc.kind,
                seq: desc.seq,
                bytes: desc.bytes(),
                rank: self.rank,
                waited,
                missing,
                history: Box::default(),
            },
            BarrierError::Broken(cause) => CommError::Broken {
                op: desc.kind,
                seq: desc.seq,
                bytes: desc.bytes(),
                rank: self.rank,
                cause,
                history: Box::default(),
            },
        }
    }

    /// Steps 1-3 of the protocol.
    pub fn enter(&self, desc: &OpDesc, io: Io) -> Result<Entered> {
        self.group.publish(self.rank, |s| {
            s.desc = Some(*desc);
            s.send = io.send;
            s.recv = io.recv;
            s.in_place = io.in_place;
        });
        self.wait_entry(desc)?;
        let slots: Vec<Slot> = (0..self.group.size).map(|r| self.group.read(r)).collect();
        let mismatch = slots.iter().enumerate().find_map(|(peer, s)| {
            let theirs = s.desc.unwrap_or(*desc);
            desc.first_difference(&theirs).map(|d| (peer, d))
        });
        if let Some((peer, (field, value, peer_value))) = mismatch {
            // Every rank found a mismatch (if all equalled us, all would be equal), so every
            // rank takes this path: leave together, then break the group.
            self.exit(desc)?;
            self.group
                .barrier
                .break_with(BreakCause::Mismatch { seq: desc.seq });
            return Err(CommError::Mismatch {
                seq: desc.seq,
                field,
                rank: self.rank,
                value,
                peer,
                peer_value,
                history: Box::default(),
            });
        }
        Ok(Entered { slots })
    }

    pub fn wait_entry(&self, desc: &OpDesc) -> Result<()> {
        let how = Wait::Entry {
            timeout: self.group.config.timeout,
            seq: desc.seq,
        };
        self.group
            .barrier
            .wait(self.rank, how)
            .map_err(|e| self.to_error(desc, e))
    }

    /// A committed wait: between phases, and step 5.
    pub fn exit(&self, desc: &OpDesc) -> Result<()> {
        self.group
            .barrier
            .wait(self.rank, Wait::Committed)
            .map_err(|e| self.to_error(desc, e))
    }
}
