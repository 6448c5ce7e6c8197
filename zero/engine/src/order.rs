//! The order in which a rank visits units, checked across ranks.
//!
//! At stage 3 every gather and every gradient reduction is a collective, so ranks that visit
//! units in different orders would pair the wrong collectives: sizes that happen to agree
//! give silent garbage, sizes that disagree a mismatch. On the first step each visit is
//! confirmed with a one-element all-gather of the unit index, so a divergence is reported at
//! the exact position on every rank; later steps are compared against that recorded order
//! locally, at no cost.

use super::error::{Error, Result};
use zero_comm::Communicator;

/// What a rank does to a unit at one point of the step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Visit {
    /// `gather` (a collective at stage 3).
    Gather,
    /// `end_backward` (the gradient's reduction).
    Reduce,
}

/// One visit as a number: unit and kind, so the record and the cross-rank check are plain
/// integers (exact in the f32 the check sends: units are far below 2^23).
fn code(unit: usize, visit: Visit) -> usize {
    2 * unit + usize::from(visit == Visit::Reduce)
}

/// The recorded unit order of one rank.
#[derive(Debug)]
pub(crate) struct OrderCheck {
    rank: usize,
    recorded: Option<Vec<usize>>,
    current: Vec<usize>,
    /// Off while evaluating: forward-only passes visit units in their own order.
    pub enabled: bool,
}

impl OrderCheck {
    pub fn new(rank: usize) -> Self {
        Self {
            rank,
            recorded: None,
            current: Vec::new(),
            enabled: true,
        }
    }

    /// Records a visit of `unit`; on the first step confirms it with every peer.
    pub fn visit(&mut self, comm: &Communicator, unit: usize, visit: Visit) -> Result<()> {
        if !self.enabled {
            return Ok(());
        }
        let position = self.current.len();
        let unit = code(unit, visit);
        self.current.push(unit);
        match &self.recorded {
            None => {
                // Unit indices are far below 2^24, so f32 carries them exactly.
                let mut all = vec![0f32; comm.size()];
                comm.all_gather(&[unit as f32], &mut all)?;
                if let Some((other_rank, &u)) =
                    all.iter().enumerate().find(|&(_, &u)| u != unit as f32)
                {
                    return Err(Error::DivergentOrder {
                        rank: self.rank,
                        position,
                        got: unit / 2,
                        other_rank,
                        expected: u as usize / 2,
                    });
                }
                Ok(())
            }
            Some(order) => match order.get(position) {
                Some(&u) if u == unit => Ok(()),
                other => Err(Error::OrderChanged {
                    rank: self.rank,
                    position,
                    got: unit / 2,
                    recorded: other.map_or(usize::MAX, |c| c / 2),
                }),
            },
        }
    }

    /// The next `k` distinct units this step will gather after the current visit, from the
    /// recorded order (none before it is recorded, or while the check is off).
    pub fn upcoming_gathers(&self, k: usize) -> Vec<usize> {
        let Some(order) = self.recorded.as_ref().filter(|_| self.enabled) else {
            return Vec::new();
        };
        let mut out = Vec::with_capacity(k);
        for &c in order.iter().skip(self.current.len()) {
            if out.len() == k {
                break;
            }
            let unit = c / 2;
            if c % 2 == 0 && !out.contains(&unit) {
                out.push(unit);
            }
        }
        out
    }

    /// Closes a step: the first one becomes the recorded order.
    pub fn end_step(&mut self) -> Result<()> {
        let current = std::mem::take(&mut self.current);
        match &self.recorded {
            None => self.recorded = Some(current),
            Some(order) if order.len() != current.len() => {
                return Err(Error::Order(format!(
                    "rank {} visited {} units this step but {} on the first step",
                    self.rank,
                    current.len(),
                    order.len()
                )))
            }
            Some(_) => {}
        }
        Ok(())
    }
}
