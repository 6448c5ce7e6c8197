//! The calls a rank makes, checked against its declared [`Schedule`] and, on the first step,
//! against its peers.
//!
//! At stage 3 every gather and every gradient reduction is a collective, so ranks that visit
//! units in different orders would pair the wrong collectives: sizes that happen to agree
//! give silent garbage, sizes that disagree a mismatch. On the first step each collective
//! call is confirmed with a one-element all-gather of its code, so a divergence is reported
//! at the exact position on every rank. Every call of every step is also compared with the
//! declared schedule (the one the memory plan replayed), locally, at no cost; the engine
//! confirms at start-up that every rank declared the same one, so prefetches launched from it
//! pair up on every rank.

use super::error::{Error, Result};
use super::schedule::{Schedule, UnitCall};
use zero_comm::Communicator;

/// The call checker of one rank.
#[derive(Debug)]
pub(crate) struct OrderCheck {
    rank: usize,
    declared: Vec<UnitCall>,
    /// Calls made so far in the current micro-step.
    position: usize,
    /// No step has completed yet: collective calls are confirmed with every peer.
    first_step: bool,
    /// Off while evaluating: forward-only passes visit units in their own order.
    pub enabled: bool,
}

impl OrderCheck {
    pub fn new(rank: usize, schedule: &Schedule) -> Self {
        Self {
            rank,
            declared: schedule.calls().to_vec(),
            position: 0,
            first_step: true,
            enabled: true,
        }
    }

    /// Checks `call` against the peers (first step, collective calls) and the schedule.
    pub fn visit(&mut self, comm: &Communicator, call: UnitCall) -> Result<()> {
        if !self.enabled {
            return Ok(());
        }
        let position = self.position;
        let collective = matches!(call, UnitCall::Gather(_) | UnitCall::EndBackward(_));
        if self.first_step && collective {
            self.confirm_with_peers(comm, call, position)?;
        }
        match self.declared.get(position) {
            Some(&want) if want == call => {
                self.position += 1;
                Ok(())
            }
            want => Err(Error::OffSchedule {
                rank: self.rank,
                position,
                got: call.to_string(),
                declared: want.map_or("the end of the micro-step".into(), |w| w.to_string()),
            }),
        }
    }

    /// One all-gather of the call's code: every rank learns whether all made the same call.
    fn confirm_with_peers(
        &self,
        comm: &Communicator,
        call: UnitCall,
        position: usize,
    ) -> Result<()> {
        // Codes are 4 x unit + kind, far below 2^24 for any real unit count, so f32 carries
        // them exactly.
        let code = call.code() as f32;
        let mut all = vec![0f32; comm.size()];
        comm.all_gather(&[code], &mut all)?;
        match all.iter().enumerate().find(|&(_, &c)| c != code) {
            Some((other_rank, &c)) => Err(Error::DivergentOrder {
                rank: self.rank,
                position,
                got: call.to_string(),
                other_rank,
                expected: UnitCall::from_code(c as usize).to_string(),
            }),
            None => Ok(()),
        }
    }

    /// Closes a micro-step, which must have made every declared call.
    pub fn end_micro_step(&mut self) -> Result<()> {
        if !self.enabled {
            return Ok(());
        }
        let made = std::mem::take(&mut self.position);
        if made != self.declared.len() {
            return Err(Error::OffSchedule {
                rank: self.rank,
                position: made,
                got: "end_micro_step".into(),
                declared: self.declared[made].to_string(),
            });
        }
        Ok(())
    }

    /// The next `k` distinct units the micro-step will gather after the current call, from
    /// the declared schedule (none while the check is off).
    pub fn upcoming_gathers(&self, k: usize) -> Vec<usize> {
        if !self.enabled {
            return Vec::new();
        }
        upcoming_gathers(&self.declared, self.position, k)
    }

    /// Closes a step: later steps no longer confirm calls with the peers.
    pub fn end_step(&mut self) {
        self.first_step = false;
    }
}

/// The first `k` distinct units gathered in `calls[from..]`: what is prefetched after the
/// call at `from - 1`. The memory plan's replay and the engine use this one rule.
pub(crate) fn upcoming_gathers(calls: &[UnitCall], from: usize, k: usize) -> Vec<usize> {
    let mut out = Vec::with_capacity(k);
    for call in calls.iter().skip(from) {
        if out.len() == k {
            break;
        }
        if let UnitCall::Gather(unit) = *call {
            if !out.contains(&unit) {
                out.push(unit);
            }
        }
    }
    out
}

/// Confirms that every rank declared the same schedule: its length, then its calls, each
/// all-gathered as f32 codes (exact below 2^24, far beyond any real unit count).
pub(crate) fn confirm_same_schedule(comm: &Communicator, schedule: &Schedule) -> Result<()> {
    let codes: Vec<f32> = schedule.calls().iter().map(|c| c.code() as f32).collect();
    let mut lens = vec![0f32; comm.size()];
    comm.all_gather(&[codes.len() as f32], &mut lens)?;
    if let Some(other) = lens.iter().position(|&n| n != codes.len() as f32) {
        return Err(Error::BadSchedule(format!(
            "of rank {} has {} calls but rank {other}'s has {}",
            comm.rank(),
            codes.len(),
            lens[other]
        )));
    }
    let mut all = vec![0f32; codes.len() * comm.size()];
    comm.all_gather(&codes, &mut all)?;
    for (other, theirs) in all.chunks_exact(codes.len().max(1)).enumerate() {
        if let Some(at) = (0..codes.len()).find(|&i| theirs[i] != codes[i]) {
            return Err(Error::BadSchedule(format!(
                "of rank {} makes {} at call {at} but rank {other}'s makes {}",
                comm.rank(),
                schedule.calls()[at],
                UnitCall::from_code(theirs[at] as usize)
            )));
        }
    }
    Ok(())
}
