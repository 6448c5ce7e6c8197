//! The engine calls of one pass, in order: what a [`Program`](crate::Program) derives from
//! its operations.
//!
//! The memory plan replays this sequence against the engine's allocation rules
//! ([`crate::plan_memory`]), so the plan is the step's peak rather than a bound; the engine
//! makes exactly these calls when it runs the program, so the plan cannot silently stop
//! describing the run.

use std::fmt;

/// One engine call of a micro-step: a unit's parameters or gradient, or a kept input
/// (activation checkpointing's saved tensors, named by the model's index).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Call {
    /// Make the unit's whole f32 parameters available (all-gathered where sharded).
    Gather(usize),
    /// End a use begun by a gather; the last frees the gathered copy.
    Release(usize),
    /// Open a zeroed f32 gradient buffer for the unit.
    BeginBackward(usize),
    /// Reduce the unit's gradient across ranks into the part this rank keeps.
    EndBackward(usize),
    /// Hand the next operation a slot to write kept input `k` into.
    BeginKeep(usize),
    /// Keep what the operation wrote (offloaded: queue its copy to host memory).
    EndKeep(usize),
    /// Start bringing kept input `k` back (offloaded: queue its copy into a free slot).
    Fetch(usize),
    /// Hand the next operation kept input `k` to read (offloaded: wait for its fetch).
    BeginRestore(usize),
    /// The operation has read kept input `k`; its slot is free again.
    EndRestore(usize),
}

/// Kinds of [`Call`], for its integer code.
const CALL_KINDS: usize = 9;

impl Call {
    /// The index the call names: a unit, or a kept input.
    pub fn index(self) -> usize {
        match self {
            Self::Gather(i)
            | Self::Release(i)
            | Self::BeginBackward(i)
            | Self::EndBackward(i)
            | Self::BeginKeep(i)
            | Self::EndKeep(i)
            | Self::Fetch(i)
            | Self::BeginRestore(i)
            | Self::EndRestore(i) => i,
        }
    }

    /// The unit the call names, for the calls on units.
    pub fn unit(self) -> Option<usize> {
        match self {
            Self::Gather(u) | Self::Release(u) | Self::BeginBackward(u) | Self::EndBackward(u) => {
                Some(u)
            }
            _ => None,
        }
    }

    fn kind(self) -> usize {
        match self {
            Self::Gather(_) => 0,
            Self::Release(_) => 1,
            Self::BeginBackward(_) => 2,
            Self::EndBackward(_) => 3,
            Self::BeginKeep(_) => 4,
            Self::EndKeep(_) => 5,
            Self::Fetch(_) => 6,
            Self::BeginRestore(_) => 7,
            Self::EndRestore(_) => 8,
        }
    }

    /// The call as one integer (index and kind), how the engine records and compares calls.
    pub(crate) fn code(self) -> usize {
        CALL_KINDS * self.index() + self.kind()
    }

    /// The call a code stands for.
    pub(crate) fn from_code(code: usize) -> Self {
        let i = code / CALL_KINDS;
        match code % CALL_KINDS {
            0 => Self::Gather(i),
            1 => Self::Release(i),
            2 => Self::BeginBackward(i),
            3 => Self::EndBackward(i),
            4 => Self::BeginKeep(i),
            5 => Self::EndKeep(i),
            6 => Self::Fetch(i),
            7 => Self::BeginRestore(i),
            _ => Self::EndRestore(i),
        }
    }
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = [
            "gather",
            "release",
            "begin_backward",
            "end_backward",
            "begin_keep",
            "end_keep",
            "fetch",
            "begin_restore",
            "end_restore",
        ][self.kind()];
        write!(f, "{name}({})", self.index())
    }
}

/// One micro-step's engine calls, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    calls: Vec<Call>,
}

impl Schedule {
    /// A schedule of exactly these calls.
    pub fn new(calls: Vec<Call>) -> Self {
        Self { calls }
    }

    /// A plain sequential model of `units` units: forward gathers and releases each unit in
    /// order; backward, in reverse, gathers each, opens, closes and releases its gradient.
    pub fn sequential(units: usize) -> Self {
        let forward = (0..units).flat_map(|u| [Call::Gather(u), Call::Release(u)]);
        let backward = (0..units).rev().flat_map(|u| {
            [
                Call::Gather(u),
                Call::BeginBackward(u),
                Call::EndBackward(u),
                Call::Release(u),
            ]
        });
        Self::new(forward.chain(backward).collect())
    }

    /// The calls, in order.
    pub fn calls(&self) -> &[Call] {
        &self.calls
    }

    /// Kept inputs the calls name: one more than the largest index (0 when none).
    pub fn kept_inputs(&self) -> usize {
        self.calls
            .iter()
            .filter(|c| c.unit().is_none())
            .map(|c| c.index() + 1)
            .max()
            .unwrap_or(0)
    }

    /// The most kept inputs held at once: each from its `begin_keep` to its `end_keep` and
    /// from its `fetch` to its `end_restore` (what a partitioned store holds whole; two at
    /// most in a checked schedule).
    pub fn kept_held(&self) -> usize {
        let mut held = 0usize;
        let mut most = 0;
        for call in &self.calls {
            match call {
                Call::BeginKeep(_) | Call::Fetch(_) => held += 1,
                Call::EndKeep(_) | Call::EndRestore(_) => held = held.saturating_sub(1),
                _ => {}
            }
            most = most.max(held);
        }
        most
    }

    /// Checks that every call names one of `units` units, that releases and gradient closes
    /// follow their opening calls, that kept inputs go keep, fetch, restore in that order
    /// ([`KeptOrder`]), and that nothing is left open at the end.
    pub(crate) fn check(&self, units: usize) -> Result<(), String> {
        let mut gathered = vec![0usize; units];
        let mut open = vec![false; units];
        let mut kept = KeptOrder::new(self.kept_inputs());
        for (at, &call) in self.calls.iter().enumerate() {
            let fault = match call.unit() {
                Some(u) if u >= units => {
                    return Err(format!("call {at}, {call}: the engine has {units} units"));
                }
                Some(u) => unit_fault(call, &mut gathered[u], &mut open[u]),
                None => kept.fault(call),
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
        kept.finished()
    }
}

/// What is wrong with unit call `call`, given the unit's gather count and open gradient.
fn unit_fault(call: Call, gathered: &mut usize, open: &mut bool) -> Option<&'static str> {
    match call {
        Call::Gather(_) => {
            *gathered += 1;
            None
        }
        Call::Release(_) if *gathered == 0 => Some("without a gather"),
        Call::Release(_) => {
            *gathered -= 1;
            None
        }
        Call::BeginBackward(_) if *open => Some("while its backward is open"),
        Call::EndBackward(_) if !*open => Some("without begin_backward"),
        _ => {
            *open = !*open;
            None
        }
    }
}

/// Where each kept input of a pass stands. Each is kept once, then fetched, then restored,
/// in that order; at most one is being written and at most one is between its fetch and the
/// end of its restore at any time, so two staging slots always suffice when kept inputs are
/// offloaded.
struct KeptOrder {
    stage: Vec<u8>,
    writing: Option<usize>,
    fetched: Option<usize>,
}

impl KeptOrder {
    const NONE: u8 = 0;
    const WRITING: u8 = 1;
    const KEPT: u8 = 2;
    const FETCHED: u8 = 3;
    const READING: u8 = 4;
    const DONE: u8 = 5;

    fn new(kept: usize) -> Self {
        Self {
            stage: vec![Self::NONE; kept],
            writing: None,
            fetched: None,
        }
    }

    /// Advances kept input `call.index()` from the stage `call` needs to the next one.
    fn fault(&mut self, call: Call) -> Option<&'static str> {
        let k = call.index();
        let (from, to, fault) = match call {
            Call::BeginKeep(_) => (Self::NONE, Self::WRITING, "a second time"),
            Call::EndKeep(_) => (Self::WRITING, Self::KEPT, "without begin_keep"),
            Call::Fetch(_) => (Self::KEPT, Self::FETCHED, "before it is kept, or twice"),
            Call::BeginRestore(_) => (Self::FETCHED, Self::READING, "without its fetch"),
            _ => (Self::READING, Self::DONE, "without begin_restore"),
        };
        if self.stage[k] != from {
            return Some(fault);
        }
        let (slot, busy) = match call {
            Call::BeginKeep(_) => (&mut self.writing, Some(k)),
            Call::EndKeep(_) => (&mut self.writing, None),
            Call::Fetch(_) => (&mut self.fetched, Some(k)),
            Call::EndRestore(_) => (&mut self.fetched, None),
            _ => (&mut None, None),
        };
        if busy.is_some() && slot.is_some() {
            return Some("while another kept input holds its staging slot");
        }
        if !matches!(call, Call::BeginRestore(_)) {
            *slot = busy;
        }
        self.stage[k] = to;
        None
    }

    /// Every kept input went the whole way.
    fn finished(&self) -> Result<(), String> {
        match self.stage.iter().position(|&s| s != Self::DONE) {
            Some(k) => Err(format!(
                "kept input {k} is not kept, fetched and restored by the end of the pass"
            )),
            None => Ok(()),
        }
    }
}

/// The first `k` distinct units gathered in `calls[from..]`: what is prefetched after the
/// call at `from - 1`. The memory plan's replay and the engine use this one rule.
pub(crate) fn upcoming_gathers(calls: &[Call], from: usize, k: usize) -> Vec<usize> {
    let mut out = Vec::with_capacity(k);
    for call in calls.iter().skip(from) {
        if out.len() == k {
            break;
        }
        if let Call::Gather(unit) = *call {
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
            Call::Gather(2),
            "backward starts at the last unit"
        );
    }

    #[test]
    fn codes_round_trip() {
        for call in [
            Call::Gather(7),
            Call::Release(0),
            Call::BeginBackward(3),
            Call::EndBackward(12),
            Call::BeginKeep(4),
            Call::EndKeep(0),
            Call::Fetch(9),
            Call::BeginRestore(1),
            Call::EndRestore(2),
        ] {
            assert_eq!(Call::from_code(call.code()), call);
        }
    }

    #[test]
    fn malformed_schedules_are_refused() {
        use Call::*;
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

    #[test]
    fn kept_inputs_go_keep_fetch_restore_with_one_slot_each_for_writing_and_reading() {
        use Call::*;
        let good = vec![
            BeginKeep(0),
            EndKeep(0),
            BeginKeep(1),
            EndKeep(1),
            Fetch(1),
            BeginRestore(1),
            EndRestore(1),
            Fetch(0),
            BeginRestore(0),
            EndRestore(0),
        ];
        assert_eq!(Schedule::new(good.clone()).check(1), Ok(()));
        assert_eq!(Schedule::new(good.clone()).kept_inputs(), 2);
        // Each input is held from its keep to its end_keep, then from its fetch on.
        assert_eq!(Schedule::new(good).kept_held(), 1);
        let overlapping = vec![
            BeginKeep(0),
            EndKeep(0),
            Fetch(0),
            BeginKeep(1),
            EndKeep(1),
            BeginRestore(0),
            EndRestore(0),
            Fetch(1),
            BeginRestore(1),
            EndRestore(1),
        ];
        assert_eq!(Schedule::new(overlapping).kept_held(), 2);
        let bad = [
            vec![EndKeep(0)],
            vec![BeginKeep(0), EndKeep(0), BeginRestore(0), EndRestore(0)],
            vec![BeginKeep(0), EndKeep(0)],
            vec![BeginKeep(0), BeginKeep(1), EndKeep(1), EndKeep(0)],
            vec![
                BeginKeep(0),
                EndKeep(0),
                BeginKeep(1),
                EndKeep(1),
                Fetch(0),
                Fetch(1),
            ],
            vec![BeginKeep(0), EndKeep(0), BeginKeep(0), EndKeep(0)],
        ];
        for calls in bad {
            assert!(Schedule::new(calls.clone()).check(1).is_err(), "{calls:?}");
        }
    }
}
