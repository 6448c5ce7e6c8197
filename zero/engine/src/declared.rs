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
    /// The program that ran last (or runs), if any.
    last: Option<usize>,
}

impl Declared {
    pub fn new(schedules: Vec<Schedule>) -> Self {
        Self {
            schedules,
            cursor: None,
            last: None,
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
        if let Some((program, _)) = cursor {
            self.last = Some(program);
        }
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

    /// The units whose gathers, from the current call on, will find them not held, in
    /// order, each once (none outside a program): `held` says which units are held now
    /// (gathered, in flight or being fetched); along the calls a release lets its unit go
    /// and a gather holds it, so a unit released and gathered again is listed.
    pub fn fetches_ahead(&self, held: Vec<bool>) -> Vec<usize> {
        match self.cursor {
            Some((program, at)) => {
                let calls = self.schedules[program].calls();
                fetches_in(calls.get(at..).unwrap_or_default(), held)
            }
            None => Vec::new(),
        }
    }

    /// [`Declared::fetches_ahead`] of the program that ran last, from its first call: the
    /// fetches of its next run, if it runs again (none before any program ran).
    pub fn fetches_of_next_run(&self, held: Vec<bool>) -> Vec<usize> {
        match self.last {
            Some(program) => fetches_in(self.schedules[program].calls(), held),
            None => Vec::new(),
        }
    }
}

/// The units whose gathers along `calls` find them not held, in order, each once.
fn fetches_in(calls: &[Call], mut held: Vec<bool>) -> Vec<usize> {
    let mut out = Vec::new();
    for call in calls {
        match *call {
            Call::Gather(unit) if !held[unit] => {
                held[unit] = true;
                if !out.contains(&unit) {
                    out.push(unit);
                }
            }
            Call::Release(unit) => held[unit] = false,
            _ => {}
        }
    }
    out
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Three units gathered and released in order, then in reverse with their backward.
    #[test]
    fn fetches_ahead_lists_a_held_unit_again_after_its_release() {
        let mut d = Declared::new(vec![Schedule::sequential(3)]);
        assert!(
            d.fetches_ahead(vec![false; 3]).is_empty(),
            "outside a program"
        );
        d.set_cursor(Some((0, 0)));
        assert_eq!(d.fetches_ahead(vec![false; 3]), [0, 1, 2]);
        // At forward's gather of unit 2, unit 2 held: its backward gather follows its
        // release, and units 1 and 0 are gathered again after theirs.
        d.set_cursor(Some((0, 4)));
        assert_eq!(d.fetches_ahead(vec![false, false, true]), [2, 1, 0]);
        // At backward's gather of unit 2, unit 1 in flight: its gather finds it held, and
        // nothing gathers it again.
        d.set_cursor(Some((0, 6)));
        assert_eq!(d.fetches_ahead(vec![false, true, true]), [0]);
    }
}
