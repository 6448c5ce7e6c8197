//! A model's micro-step declared once, as data: its operations in order, each naming the
//! units whose parameters it reads and the units whose gradients it adds into.
//!
//! From that one declaration the engine derives everything else ([`Program::new`]):
//! 1. before an operation, every unit it reads and no earlier one holds is gathered (in the
//!    order the operation names them), then every unit it writes whose gradient is not open
//!    gets a zeroed gradient buffer; then the kept input it restores is made readable and a
//!    slot is opened for the kept input it keeps;
//! 2. the model runs the operation ([`crate::Model::run`]);
//! 3. after it, the restored input's slot is freed and the kept one is kept (offloaded: its
//!    copy to host is queued); if the next restore of the program is due (this operation
//!    kept that input or restored the one before it), its fetch is queued, one restore
//!    ahead; then every open gradient the next operation does not write is reduced (oldest
//!    first), and every gathered unit the next operation does not read is released.
//!
//! So a unit stays gathered across a run of consecutive operations that read it (a tied
//! weight used by the head's forward and backward) and a gradient is reduced as soon as the
//! last of a run of operations writing it is done (a tied weight written at both ends of
//! the pass is reduced twice, its parts added to the shard in that order). Kept inputs
//! (activation checkpointing: a tensor saved in forward and read again before a recompute in
//! backward) are each kept once and restored once, later in the same pass. The derived
//! calls are the program's [`Schedule`]: the memory plan replays them, the engine makes them.

use super::schedule::{Call, Schedule};
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
    /// The kept input the operation writes ([`crate::OpUnits::kept_mut`]), to be read back
    /// by a later operation.
    pub keeps: Option<usize>,
    /// The kept input the operation reads ([`crate::OpUnits::restored`]), kept earlier.
    pub restores: Option<usize>,
}

impl<K> Op<K> {
    /// An operation touching no unit.
    pub fn new(kind: K) -> Self {
        Self {
            kind,
            reads: Vec::new(),
            writes: Vec::new(),
            keeps: None,
            restores: None,
        }
    }

    /// This operation, writing kept input `k` (an index the model chooses, from 0).
    #[must_use]
    pub fn keeps(mut self, k: usize) -> Self {
        self.keeps = Some(k);
        self
    }

    /// This operation, reading kept input `k` back.
    #[must_use]
    pub fn restores(mut self, k: usize) -> Self {
        self.restores = Some(k);
        self
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
    /// An operation naming a unit past `units`, or one unit twice in its reads or its
    /// writes; a kept input kept twice, restored before it is kept or twice, or never
    /// restored.
    pub fn new(ops: Vec<Op<K>>, units: usize) -> Result<Self, String> {
        for (at, op) in ops.iter().enumerate() {
            check_op(op, units).map_err(|e| format!("operation {at}, {:?}: {e}", op.kind))?;
        }
        let fetch_after = fetch_points(&ops)?;
        let mut derive = Derivation::default();
        let mut runs_after = Vec::with_capacity(ops.len());
        for (at, op) in ops.iter().enumerate() {
            derive.open(op);
            runs_after.push(derive.calls.len());
            derive.finish_kept(op, fetch_after[at]);
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

/// For each operation, the kept input whose fetch is queued after it: the i-th restore's
/// after the later of its keep and the restore before it (one restore ahead).
fn fetch_points<K: fmt::Debug>(ops: &[Op<K>]) -> Result<Vec<Option<usize>>, String> {
    let mut kept_at: Vec<Option<usize>> = Vec::new();
    let mut restored = Vec::new();
    let mut fetch_after = vec![None; ops.len()];
    let mut last_restore = None;
    for (at, op) in ops.iter().enumerate() {
        let fault = |e: String| format!("operation {at}, {:?}: {e}", op.kind);
        if let Some(k) = op.restores {
            let keep = kept_at.get(k).copied().flatten();
            let keep = keep.ok_or_else(|| fault(format!("restores {k}, not kept before")))?;
            if restored.contains(&k) {
                return Err(fault(format!("restores {k} a second time")));
            }
            restored.push(k);
            let point: usize = last_restore.map_or(keep, |r: usize| r.max(keep));
            fetch_after[point] = Some(k);
            last_restore = Some(at);
        }
        if let Some(k) = op.keeps {
            if kept_at.len() <= k {
                kept_at.resize(k + 1, None);
            }
            if kept_at[k].replace(at).is_some() {
                return Err(fault(format!("keeps {k} a second time")));
            }
        }
    }
    match (0..kept_at.len()).find(|&k| kept_at[k].is_some() && !restored.contains(&k)) {
        Some(k) => Err(format!("kept input {k} is kept but never restored")),
        None => Ok(fetch_after),
    }
}

/// The derivation's state: what is gathered and open after the calls made so far.
#[derive(Default)]
struct Derivation {
    calls: Vec<Call>,
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
                self.calls.push(Call::Gather(u));
            }
        }
        for &u in &op.writes {
            if !self.open.contains(&u) {
                self.open.push(u);
                self.calls.push(Call::BeginBackward(u));
            }
        }
        self.calls.extend(op.restores.map(Call::BeginRestore));
        self.calls.extend(op.keeps.map(Call::BeginKeep));
    }

    /// Rule 3's kept inputs: frees the restored one, keeps the written one, then queues
    /// `fetch`.
    fn finish_kept<K>(&mut self, op: &Op<K>, fetch: Option<usize>) {
        self.calls.extend(op.restores.map(Call::EndRestore));
        self.calls.extend(op.keeps.map(Call::EndKeep));
        self.calls.extend(fetch.map(Call::Fetch));
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
                calls.push(Call::EndBackward(*u));
            }
            keep
        });
        self.gathered.retain(|u| {
            let keep = reads.contains(u);
            if !keep {
                calls.push(Call::Release(*u));
            }
            keep
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Call::{BeginBackward as Begin, EndBackward as End, Gather, Release};

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
    fn kept_inputs_are_fetched_one_restore_ahead() {
        use Call::{BeginKeep, BeginRestore, EndKeep, EndRestore, Fetch};
        // Three segments kept in forward; backward restores 1 then 0 (2 stays in place).
        let ops = vec![
            Op::new("f0").keeps(0),
            Op::new("f1").keeps(1),
            Op::new("f2"),
            Op::new("r1").restores(1),
            Op::new("b1"),
            Op::new("r0").restores(0),
        ];
        let p = Program::new(ops, 1).unwrap();
        let want = [
            BeginKeep(0),
            EndKeep(0),
            BeginKeep(1),
            EndKeep(1),
            Fetch(1), // after its keep: the first restore has no restore before it
            BeginRestore(1),
            EndRestore(1),
            Fetch(0), // after the restore before it
            BeginRestore(0),
            EndRestore(0),
        ];
        assert_eq!(p.schedule().calls(), &want);
        assert_eq!(p.schedule().check(1), Ok(()));
        assert_eq!(
            (0..6).map(|i| p.calls_before(i)).collect::<Vec<_>>(),
            [1, 3, 5, 6, 8, 9]
        );
    }

    #[test]
    fn kept_inputs_out_of_order_are_refused() {
        let restore_first = vec![Op::new("r").restores(0), Op::new("k").keeps(0)];
        let err = Program::new(restore_first, 1).unwrap_err();
        assert!(err.contains("not kept before"), "{err}");
        let never = vec![Op::new("k").keeps(3)];
        let err = Program::new(never, 1).unwrap_err();
        assert!(err.contains("never restored"), "{err}");
        let twice = vec![Op::new("a").keeps(0), Op::new("b").keeps(0)];
        let err = Program::new(twice, 1).unwrap_err();
        assert!(err.contains("second time"), "{err}");
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
