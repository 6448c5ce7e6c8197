//! A model's micro-step declared once, as data: its operations in order, each naming the
//! units whose parameters it reads and the units whose gradients it adds into.
//!
//! From that one declaration the engine derives everything else ([`Program::new`]):
//! 1. before an operation, every unit it reads and no earlier one holds is gathered (in the
//!    order the operation names them), then every unit it writes whose gradient is not open
//!    gets a zeroed gradient buffer;
//! 2. the model runs the operation ([`crate::Model::run`]);
//! 3. after it, every open gradient the next operation does not write is reduced (oldest
//!    first), then every gathered unit the next operation does not read is released.
//!
//! So a unit stays gathered across a run of consecutive operations that read it (a tied
//! weight used by the head's forward and backward) and a gradient is reduced as soon as the
//! last of a run of operations writing it is done (a tied weight written at both ends of
//! the pass is reduced twice, its parts added to the shard in that order). The derived calls
//! are the program's [`Schedule`]: the memory plan replays them, the engine makes them.

use super::schedule::{Schedule, UnitCall};
use std::fmt;

/// One operation of a micro-step: the model's own description of it (`kind`, what
/// [`crate::Model::run`] receives) and the units it touches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Op<K> {
    /// What the model runs.
    pub kind: K,
    /// Units whose whole parameters the operation reads.
    pub reads: Vec<usize>,
    /// Units whose gradients the operation adds into.
    pub writes: Vec<usize>,
}

impl<K> Op<K> {
    /// An operation touching no unit.
    pub fn new(kind: K) -> Self {
        Self {
            kind,
            reads: Vec::new(),
            writes: Vec::new(),
        }
    }

    /// This operation, reading the parameters of `units` too.
    #[must_use]
    pub fn reads(mut self, units: impl IntoIterator<Item = usize>) -> Self {
        self.reads.extend(units);
        self
    }

    /// This operation, adding into the gradients of `units` too.
    #[must_use]
    pub fn writes(mut self, units: impl IntoIterator<Item = usize>) -> Self {
        self.writes.extend(units);
        self
    }
}

/// A micro-step (or a forward-only pass) as operations, with the engine calls derived from
/// them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Program<K> {
    ops: Vec<Op<K>>,
    schedule: Schedule,
    /// `runs_after[i]`: how many of the schedule's calls come before operation `i` runs.
    runs_after: Vec<usize>,
}

impl<K: fmt::Debug> Program<K> {
    /// The program of `ops`, in order, on a model of `units` units.
    ///
    /// # Errors
    /// An operation naming a unit past `units`, or one unit twice in its reads or its writes.
    pub fn new(ops: Vec<Op<K>>, units: usize) -> Result<Self, String> {
        for (at, op) in ops.iter().enumerate() {
            check_op(op, units).map_err(|e| format!("operation {at}, {:?}: {e}", op.kind))?;
        }
        let mut derive = Derivation::default();
        let mut runs_after = Vec::with_capacity(ops.len());
        for (at, op) in ops.iter().enumerate() {
            derive.open(op);
            runs_after.push(derive.calls.len());
            derive.close_unless_used_by(ops.get(at + 1));
        }
        Ok(Self {
            ops,
            schedule: Schedule::new(derive.calls),
            runs_after,
        })
    }
}

impl<K> Program<K> {
    /// The operations, in order.
    pub fn ops(&self) -> &[Op<K>] {
        &self.ops
    }

    /// The engine calls the program makes, in order: what the memory plan replays.
    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// How many of [`Program::schedule`]'s calls come before operation `op` runs.
    pub fn calls_before(&self, op: usize) -> usize {
        self.runs_after[op]
    }

    /// True when no operation writes a gradient: a forward-only pass (evaluation, sampling).
    pub fn is_forward_only(&self) -> bool {
        self.ops.iter().all(|op| op.writes.is_empty())
    }
}

/// A unit in range, and named at most once in the reads and once in the writes.
fn check_op<K>(op: &Op<K>, units: usize) -> Result<(), String> {
    for (list, what) in [(&op.reads, "reads"), (&op.writes, "writes")] {
        if let Some(&u) = list.iter().find(|&&u| u >= units) {
            return Err(format!("{what} unit {u} of a model of {units} units"));
        }
        if let Some(i) = (1..list.len()).find(|&i| list[..i].contains(&list[i])) {
            return Err(format!("{what} unit {} twice", list[i]));
        }
    }
    Ok(())
}

/// The derivation's state: what is gathered and open after the calls made so far.
#[derive(Default)]
struct Derivation {
    calls: Vec<UnitCall>,
    /// Gathered units, in gather order.
    gathered: Vec<usize>,
    /// Units whose gradient is open, in opening order.
    open: Vec<usize>,
}

impl Derivation {
    /// Rule 1: gathers `op`'s reads and opens its writes that are not already.
    fn open<K>(&mut self, op: &Op<K>) {
        for &u in &op.reads {
            if !self.gathered.contains(&u) {
                self.gathered.push(u);
                self.calls.push(UnitCall::Gather(u));
            }
        }
        for &u in &op.writes {
            if !self.open.contains(&u) {
                self.open.push(u);
                self.calls.push(UnitCall::BeginBackward(u));
            }
        }
    }

    /// Rule 3: reduces open gradients and releases gathered units that `next` does not
    /// use (everything after the last operation).
    fn close_unless_used_by<K>(&mut self, next: Option<&Op<K>>) {
        let writes = next.map_or(&[][..], |op| &op.writes);
        let reads = next.map_or(&[][..], |op| &op.reads);
        let calls = &mut self.calls;
        self.open.retain(|u| {
            let keep = writes.contains(u);
            if !keep {
                calls.push(UnitCall::EndBackward(*u));
            }
            keep
        });
        self.gathered.retain(|u| {
            let keep = reads.contains(u);
            if !keep {
                calls.push(UnitCall::Release(*u));
            }
            keep
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use UnitCall::{BeginBackward as Begin, EndBackward as End, Gather, Release};

    #[test]
    fn a_sequential_model_derives_gather_compute_release_and_reverse_reductions() {
        let ops = vec![
            Op::new("f0").reads([0]),
            Op::new("f1").reads([1]),
            Op::new("b1").reads([1]).writes([1]),
            Op::new("b0").reads([0]).writes([0]),
        ];
        let p = Program::new(ops, 2).unwrap();
        let want = [
            Gather(0),
            Release(0),
            Gather(1),
            Begin(1),
            End(1),
            Release(1),
            Gather(0),
            Begin(0),
            End(0),
            Release(0),
        ];
        // Written out by hand: unit 1 stays gathered from its forward into its backward.
        assert_eq!(p.schedule().calls(), &want);
        assert_eq!(
            (0..4).map(|i| p.calls_before(i)).collect::<Vec<_>>(),
            [1, 3, 4, 8]
        );
        assert!(!p.is_forward_only());
    }

    #[test]
    fn a_tied_weight_written_at_both_ends_is_reduced_twice() {
        let ops = vec![
            Op::new("embed").reads([0]),
            Op::new("head").reads([0]).writes([0]),
            Op::new("mid").reads([1]).writes([1]),
            Op::new("embed back").writes([0]),
        ];
        let p = Program::new(ops, 2).unwrap();
        let ends = p
            .schedule()
            .calls()
            .iter()
            .filter(|c| **c == End(0))
            .count();
        assert_eq!(ends, 2);
        assert_eq!(p.schedule().calls().last(), Some(&End(0)));
    }

    #[test]
    fn bad_operations_are_refused_naming_them() {
        let err = Program::new(vec![Op::new("x").reads([2])], 2).unwrap_err();
        assert!(
            err.contains("operation 0") && err.contains("unit 2"),
            "{err}"
        );
        let err = Program::new(vec![Op::new("y").writes([1, 1])], 2).unwrap_err();
        assert!(err.contains("twice"), "{err}");
    }
}
