//! The protocol over a copier with the GPU's semantics, simulated on the host: a job is
//! "done" as soon as it is queued (the host never waits), copies run on a deferred copy
//! stream, and the compute side runs at once but waits on a slot's event (O2 of `cuda`) by
//! running the copy stream up to that slot's latest copy. Copies are deferred as long as
//! they can be, the worst case for a missing wait. Restores give back what was kept (against
//! a plain per-segment copy); with the waits switched off they do not, so the test sees them.

use std::collections::VecDeque;

use super::protocol::{Copier, Done, Job, Offloader};
use zero_gpt::KeptInputs;

const N: usize = 4;

/// A slot: its index in the simulator's memory and the copy after which its event fires.
#[derive(Debug)]
struct SimSlot {
    id: usize,
    copied: u64,
}

/// A queued copy: (segment, slot id, to host).
type Copy = (usize, usize, bool);

#[derive(Debug)]
struct SimStreams {
    honour_waits: bool,
    slot_memory: Vec<Vec<f32>>,
    hosts: Vec<Vec<f32>>,
    copy_stream: VecDeque<Copy>,
    queued_copies: u64,
    run_copies: u64,
    done: VecDeque<Done<SimSlot>>,
}

impl SimStreams {
    /// Runs the copy stream until copy number `event` has run.
    fn run_to(&mut self, event: u64) {
        while self.run_copies < event {
            let Some((segment, id, to_host)) = self.copy_stream.pop_front() else {
                return;
            };
            if to_host {
                self.hosts[segment].copy_from_slice(&self.slot_memory[id]);
            } else {
                self.slot_memory[id].copy_from_slice(&self.hosts[segment]);
            }
            self.run_copies += 1;
        }
    }
}

impl SimStreams {
    /// A compute-side copy on the slots' memory, after the copies up to `event` (O2); with
    /// the waits off, those copies run after it instead.
    fn compute_after(&mut self, event: u64, copy: impl FnOnce(&mut Vec<Vec<f32>>)) {
        if self.honour_waits {
            self.run_to(event);
        }
        copy(&mut self.slot_memory);
        self.run_to(event);
    }
}

impl Copier for SimStreams {
    type Slot = SimSlot;
    type View = [f32];

    fn slot_len(_: &SimSlot) -> usize {
        N
    }

    fn send(&mut self, job: Job<SimSlot>) -> Result<(), String> {
        let Some((segment, mut slot, fetch)) = job.into_parts() else {
            return Err("injected".into());
        };
        self.copy_stream
            .push_back((segment, slot.id, fetch.is_none()));
        self.queued_copies += 1;
        slot.copied = self.queued_copies;
        self.done.push_back(Done {
            segment,
            slot,
            fetch,
            result: Ok(()),
        });
        Ok(())
    }

    fn in_flight(&self) -> usize {
        self.done.len()
    }

    fn recv(&mut self) -> Option<Done<SimSlot>> {
        self.done.pop_front()
    }

    fn stage(&mut self, slot: &mut SimSlot, input: &[f32]) -> Result<(), String> {
        self.compute_after(slot.copied, |memory| memory[slot.id].copy_from_slice(input));
        Ok(())
    }

    fn unstage(&mut self, slot: &SimSlot, input: &mut [f32]) -> Result<(), String> {
        self.compute_after(slot.copied, |memory| {
            input.copy_from_slice(&memory[slot.id])
        });
        Ok(())
    }
}

fn offloader(segments: usize, honour_waits: bool) -> Offloader<SimStreams> {
    let copier = SimStreams {
        honour_waits,
        slot_memory: vec![vec![0.0; N]; 2],
        hosts: vec![vec![0.0; N]; segments],
        copy_stream: VecDeque::new(),
        queued_copies: 0,
        run_copies: 0,
        done: VecDeque::new(),
    };
    let slots = (0..2).map(|id| SimSlot { id, copied: 0 }).collect();
    Offloader::new(copier, slots, segments, N).unwrap()
}

/// Two steps in the model's order (keep 0..S, hint S-2, restore S-2..0 with a hint after
/// each); returns each restore's result beside what was kept.
fn model_order(kept: &mut Offloader<SimStreams>, segments: usize) -> Vec<(Vec<f32>, Vec<f32>)> {
    let mut seen = Vec::new();
    for step in 0..2 {
        let inputs: Vec<Vec<f32>> = (0..segments)
            .map(|s| (0..N).map(|i| (100 * step + 10 * s + i) as f32).collect())
            .collect();
        for (s, x) in inputs.iter().enumerate() {
            kept.keep(s, x).unwrap();
        }
        kept.due_next(segments - 2).unwrap();
        for s in (0..segments - 1).rev() {
            let mut out = vec![-1.0; N];
            kept.restore(s, &mut out).unwrap();
            seen.push((out, inputs[s].clone()));
            if s > 0 {
                kept.due_next(s - 1).unwrap();
            }
        }
    }
    seen
}

#[test]
fn restores_are_right_when_copies_finish_only_as_late_as_the_waits_allow() {
    for segments in [2, 3, 5] {
        let mut kept = offloader(segments, true);
        for (got, want) in model_order(&mut kept, segments) {
            assert_eq!(got, want, "{segments} segments");
        }
    }
}

#[test]
fn without_the_waits_on_slot_events_restores_go_wrong() {
    let mut kept = offloader(5, false);
    let seen = model_order(&mut kept, 5);
    assert!(
        seen.iter().any(|(got, want)| got != want),
        "the waits are not needed?"
    );
}
