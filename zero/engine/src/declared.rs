//! The programs a rank declared at start-up, the one running, and how far it has come.
//!
//! Every rank must declare the same programs: at stage 3 each gather and each gradient
//! reduction is a collective, so ranks making different calls would pair the wrong
//! collectives (sizes that happen to agree give silent garbage). The engine confirms the
//! declarations with its peers once, at start-up ([`confirm_same_schedules`]); after that the
//! calls are derived from the same data on every rank, so they cannot diverge. Prefetches
//! read ahead in the running program's calls ([`Declared::upcoming_gathers`]), so every rank
//! launches the same ones.

use super::error::{Error, Result};
use super::planning::schedule::{upcoming_gathers, Call, Schedule};
use zero_comm::Communicator;

/// The declared schedules and the position in the running one.
#[derive(Debug)]
pub(crate) struct Declared {
    schedules: Vec<Schedule>,
    /// (program, index of the call being made) while a program runs.
    cursor: Option<(usize, usize)>,
}

impl Declared {
    pub fn new(schedules: Vec<Schedule>) -> Self {
        Self {
            schedules,
            cursor: None,
        }
    }

    /// Which declared program makes exactly `schedule`'s calls.
    pub fn find(&self, schedule: &Schedule) -> Option<usize> {
        self.schedules.iter().position(|s| s == schedule)
    }

    /// Call `at` of program `program` (which [`Declared::find`] returned).
    pub fn call(&self, program: usize, at: usize) -> Call {
        self.schedules[program].calls()[at]
    }

    /// The calls the program makes.
    pub fn len(&self, program: usize) -> usize {
        self.schedules[program].calls().len()
    }

    /// Marks call `at` of `program` as being made (`None`: no program runs).
    pub fn set_cursor(&mut self, cursor: Option<(usize, usize)>) {
        self.cursor = cursor;
    }

    /// The next `k` distinct units the running program gathers after the current call (none
    /// outside a program).
    pub fn upcoming_gathers(&self, k: usize) -> Vec<usize> {
        match self.cursor {
            Some((program, at)) => upcoming_gathers(self.schedules[program].calls(), at + 1, k),
            None => Vec::new(),
        }
    }

    /// As [`Declared::upcoming_gathers`], from the current call on (the call being made
    /// included).
    pub fn gathers_from_current(&self, k: usize) -> Vec<usize> {
        match self.cursor {
            Some((program, at)) => upcoming_gathers(self.schedules[program].calls(), at, k),
            None => Vec::new(),
        }
    }
}

/// Confirms that every rank declared the same schedules: their count and lengths, then their
/// calls, each all-gathered as an i64 code.
pub(crate) fn confirm_same_schedules(comm: &Communicator, schedules: &[&Schedule]) -> Result<()> {
    // The count first: the lengths' all-gather needs the same length on every rank.
    let mine = [schedules.len() as i64];
    let counts = all_gather_codes(comm, &mine)?;
    if let Some(other) = counts.iter().position(|c| c[..] != mine) {
        return Err(Error::BadProgram(format!(
            "rank {} declared {} programs but rank {other} declared {}",
            comm.rank(),
            mine[0],
            counts[other][0]
        )));
    }
    let lens: Vec<i64> = schedules.iter().map(|s| s.calls().len() as i64).collect();
    let theirs = all_gather_codes(comm, &lens)?;
    if let Some(other) = theirs.iter().position(|t| *t != lens) {
        return Err(Error::BadProgram(format!(
            "rank {} declared programs of {lens:?} calls but rank {other} declared {:?}",
            comm.rank(),
            theirs[other]
        )));
    }
    for (p, schedule) in schedules.iter().enumerate() {
        let codes: Vec<i64> = schedule.calls().iter().map(|c| c.code() as i64).collect();
        let theirs = all_gather_codes(comm, &codes)?;
        for (other, their) in theirs.iter().enumerate() {
            if let Some(at) = (0..codes.len()).find(|&i| their[i] != codes[i]) {
                return Err(Error::BadProgram(format!(
                    "program {p} of rank {} makes {} at call {at} but rank {other}'s makes {}",
                    comm.rank(),
                    schedule.calls()[at],
                    Call::from_code(their[at] as usize)
                )));
            }
        }
    }
    Ok(())
}

/// Every rank's `codes` (all ranks pass the same length), rank by rank.
fn all_gather_codes(comm: &Communicator, codes: &[i64]) -> Result<Vec<Vec<i64>>> {
    if codes.is_empty() {
        return Ok(vec![Vec::new(); comm.size()]);
    }
    let mut all = vec![0i64; codes.len() * comm.size()];
    comm.all_gather(codes, &mut all)?;
    Ok(all.chunks_exact(codes.len()).map(<[i64]>::to_vec).collect())
}
