//! The engine calls of one pass, in order: what a [`Program`](crate::Program) derives from
//! its operations.
//!
//! The memory plan replays this sequence against the engine's allocation rules
//! ([`crate::plan_memory`]), so the plan is the step's peak rather than a bound; the engine
//! makes exactly these calls when it runs the program, so the plan cannot silently stop
//! describing the run.

use std::fmt;

/// One engine call of a micro-step, naming its unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UnitCall {
    /// Make the unit's whole f32 parameters available (all-gathered where sharded).
    Gather(usize),
    /// End a use begun by a gather; the last frees the gathered copy.
    Release(usize),
    /// Open a zeroed f32 gradient buffer for the unit.
    BeginBackward(usize),
    /// Reduce the unit's gradient across ranks into the part this rank keeps.
    EndBackward(usize),
}

impl UnitCall {
    /// The unit the call names.
    pub fn unit(self) -> usize {
        match self {
            Self::Gather(u) | Self::Release(u) | Self::BeginBackward(u) | Self::EndBackward(u) => u,
        }
    }

    /// The call as one integer (unit and kind), how the engine records and compares calls.
    pub(crate) fn code(self) -> usize {
        let kind = match self {
            Self::Gather(_) => 0,
            Self::Release(_) => 1,
            Self::BeginBackward(_) => 2,
            Self::EndBackward(_) => 3,
        };
        4 * self.unit() + kind
    }

    /// The call a code stands for.
    pub(crate) fn from_code(code: usize) -> Self {
        let unit = code / 4;
        match code % 4 {
            0 => Self::Gather(unit),
            1 => Self::Release(unit),
            2 => Self::BeginBackward(unit),
            _ => Self::EndBackward(unit),
        }
    }
}

impl fmt::Display for UnitCall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Gather(u) => write!(f, "gather({u})"),
            Self::Release(u) => write!(f, "release({u})"),
            Self::BeginBackward(u) => write!(f, "begin_backward({u})"),
            Self::EndBackward(u) => write!(f, "end_backward({u})"),
        }
    }
}

/// One micro-step's engine calls, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    calls: Vec<UnitCall>,
}

impl Schedule {
    /// A schedule of exactly these calls.
    pub fn new(calls: Vec<UnitCall>) -> Self {
        Self { calls }
    }

    /// A plain sequential model of `units` units: forward gathers and releases each unit in
    /// order; backward, in reverse, gathers each, opens, closes and releases its gradient.
    pub fn sequential(units: usize) -> Self {
        let forward = (0..units).flat_map(|u| [UnitCall::Gather(u), UnitCall::Release(u)]);
        let backward = (0..units).rev().flat_map(|u| {
            [
                UnitCall::Gather(u),
                UnitCall::BeginBackward(u),
                UnitCall::EndBackward(u),
                UnitCall::Release(u),
            ]
        });
        Self::new(forward.chain(backward).collect())
    }

    /// The calls, in order.
    pub fn calls(&self) -> &[UnitCall] {
        &self.calls
    }

    /// Checks that every call names one of `units` units, that releases and gradient closes
    /// follow their opening calls, and that nothing is left open at the end.
    pub(crate) fn check(&self, units: usize) -> Result<(), String> {
        let mut gathered = vec![0usize; units];
        let mut open = vec![false; units];
        for (at, &call) in self.calls.iter().enumerate() {
            let u = call.unit();
            if u >= units {
                return Err(format!("call {at}, {call}: the engine has {units} units"));
            }
            let fault = match call {
                UnitCall::Gather(_) => {
                    gathered[u] += 1;
                    None
                }
                UnitCall::Release(_) if gathered[u] == 0 => Some("without a gather"),
                UnitCall::Release(_) => {
                    gathered[u] -= 1;
                    None
                }
                UnitCall::BeginBackward(_) if open[u] => Some("while its backward is open"),
                UnitCall::EndBackward(_) if !open[u] => Some("without begin_backward"),
                UnitCall::BeginBackward(_) | UnitCall::EndBackward(_) => {
                    open[u] = !open[u];
                    None
                }
            };
            if let Some(fault) = fault {
                return Err(format!("call {at}, {call}, comes {fault}"));
            }
        }
        if let Some(u) = (0..units).find(|&u| gathered[u] > 0 || open[u]) {
            return Err(format!(
                "unit {u} is still gathered or in backward at the end of the micro-step"
            ));
        }
        Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sequential_schedule_is_well_formed_and_visits_every_unit_six_times() {
        let s = Schedule::sequential(3);
        assert!(s.check(3).is_ok());
        assert_eq!(s.calls().len(), 3 * 6);
        assert_eq!(
            s.calls()[6],
            UnitCall::Gather(2),
            "backward starts at the last unit"
        );
    }

    #[test]
    fn codes_round_trip() {
        for call in [
            UnitCall::Gather(7),
            UnitCall::Release(0),
            UnitCall::BeginBackward(3),
            UnitCall::EndBackward(12),
        ] {
            assert_eq!(UnitCall::from_code(call.code()), call);
        }
    }

    #[test]
    fn malformed_schedules_are_refused() {
        use UnitCall::*;
        let bad = [
            vec![Gather(3)],
            vec![Release(0)],
            vec![EndBackward(0)],
            vec![BeginBackward(0), BeginBackward(0)],
            vec![Gather(0)],
        ];
        for calls in bad {
            assert!(Schedule::new(calls.clone()).check(2).is_err(), "{calls:?}");
        }
    }
}
