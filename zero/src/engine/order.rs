//! The order in which a rank visits units, checked across ranks.
//!
//! At stage 3 every gather and every gradient reduction is a collective, so ranks that visit
//! units in different orders would pair the wrong collectives: sizes that happen to agree
//! give silent garbage, sizes that disagree a mismatch. On the first step each visit is
//! confirmed with a one-element all-gather of the unit index, so a divergence is reported at
//! the exact position on every rank; later steps are compared against that recorded order
//! locally, at no cost.

use super::error::{EngineError, Result};
use zero_comm::Communicator;

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
    pub fn visit(&mut self, comm: &Communicator, unit: usize) -> Result<()> {
        if !self.enabled {
            return Ok(());
        }
        let position = self.current.len();
        self.current.push(unit);
        match &self.recorded {
            None => {
                // Unit indices are far below 2^24, so f32 carries them exactly.
                let mut all = vec![0f32; comm.size()];
                comm.all_gather(&[unit as f32], &mut all)?;
                if let Some((other_rank, &u)) =
                    all.iter().enumerate().find(|&(_, &u)| u != unit as f32)
                {
                    return Err(EngineError::DivergentOrder {
                        rank: self.rank,
                        position,
                        got: unit,
                        other_rank,
                        expected: u as usize,
                    });
                }
                Ok(())
            }
            Some(order) => match order.get(position) {
                Some(&u) if u == unit => Ok(()),
                other => Err(EngineError::OrderChanged {
                    rank: self.rank,
                    position,
                    got: unit,
                    recorded: other.copied().unwrap_or(usize::MAX),
                }),
            },
        }
    }

    /// Closes a step: the first one becomes the recorded order.
    pub fn end_step(&mut self) -> Result<()> {
        let current = std::mem::take(&mut self.current);
        match &self.recorded {
            None => self.recorded = Some(current),
            Some(order) if order.len() != current.len() => {
                return Err(EngineError::Order(format!(
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
