//! Faults injected on purpose (`--inject-fault`) and the cross-rank fingerprint
//! (`--fingerprint-every`) that catches a rank whose parameters silently diverged.

use super::Trainer;
use crate::bridge::{full_params, gpt_program, train_program, Placement};
use crate::error::TrainError;
use crate::run::fault::due;
use zero_gpt::train_ops;

impl<'a, B: Placement> Trainer<'a, B> {
    /// Arms the faults due on this rank at `step` of this attempt: collective faults on the
    /// engine's communicator (every collective of a host run goes through it), `diverge` for
    /// the step's first micro-step. Each is announced on stderr, so a log names every fault.
    pub(super) fn arm_faults(&mut self, step: u64) {
        let cfg = self.shared.cfg;
        for spec in due(&cfg.inject_fault, self.rank, step, self.shared.attempt) {
            eprintln!("zero-train: rank {}: injecting fault {spec}", self.rank);
            match spec.comm_fault() {
                Some(fault) => self.engine.comm().inject(fault),
                None => self.diverge = true,
            }
        }
    }

    /// An injected `diverge`: the micro-step runs a program the engine was not declared
    /// (the first block's forward before the embedding's), as a rank whose code departs
    /// from its peers' would.
    pub(super) fn diverged_micro_step(&mut self) -> Result<f32, TrainError> {
        let layout = self.model.layout();
        let every = self.acts.checkpoint_every();
        let mut ops = train_ops(layout.final_norm_unit() - 1, every);
        ops.swap(0, 1);
        let program = gpt_program(layout, ops, every)?;
        let (x, y) = (&self.x, &self.y);
        Ok(train_program(
            &mut self.engine,
            &program,
            &self.model,
            &mut self.acts,
            x,
            y,
        )?)
    }

    /// Compares a hash of the parameters this rank holds across ranks after `step` steps.
    /// Below stage 3 (the only stages `--fingerprint-every` is accepted at) every rank holds
    /// every parameter, so any difference is a divergence.
    ///
    /// # Errors
    /// [`TrainError::Diverged`] naming the ranks that differ from the majority; engine or
    /// collective errors.
    pub(crate) fn fingerprint(&mut self, step: u64) -> Result<(), TrainError> {
        let units = full_params(&mut self.engine)?;
        let hash = zero_comm::fault::hash_f32_bits(units.iter().flatten().copied());
        let hashes = self.engine.comm().gather_hashes(hash)?;
        let ranks = zero_comm::fault::outliers(&hashes);
        if ranks.is_empty() {
            return Ok(());
        }
        let hex: Vec<String> = hashes.iter().map(|h| format!("{h:016x}")).collect();
        Err(TrainError::Diverged {
            step,
            rank: self.rank,
            ranks,
            hashes: hex.join(" "),
        })
    }
}
