//! The engine running a declared program: its derived calls, with the model's operations
//! between them ([`crate::Program`] states the rules that place them).
//!
//! On a failure (the model's or the engine's) the engine lets go of what the program held,
//! its gathered copies, open gradients and kept-input copies, and returns the first error: the next program
//! starts from a clean state, and a failing clean-up never hides the failure that caused it.

use super::engine::Engine;
use super::error::{Error, Result};
use super::model::{Model, OpUnits};
use super::planning::program::Program;
use super::planning::schedule::Call;
use super::trace::Lane;
use std::time::Instant;

impl Engine {
    /// One training micro-step: runs `program` (declared at start-up) on `model`, its
    /// gradients reduced as they complete, then closes the micro-step; [`Engine::step`]
    /// applies the accumulated gradients.
    ///
    /// # Errors
    /// A program not declared to the engine, or one that writes no gradient (a forward-only
    /// pass is [`Engine::forward`]'s); the model's errors, memory and communication failures.
    pub fn micro_step<M: Model>(
        &mut self,
        program: &Program<M::Op>,
        model: &mut M,
    ) -> Result<(), M::Error> {
        if program.is_forward_only() {
            return Err(Error::BadProgram(
                "Engine::micro_step trains, and this program writes no gradient (run a \
                 forward-only pass with Engine::forward)"
                    .into(),
            )
            .into());
        }
        self.run_program(program, model)?;
        self.end_micro_step()?;
        Ok(())
    }

    /// A forward-only pass (evaluation, sampling): runs `program`, which writes no
    /// gradient, on `model`. Launches the same prefetches as training; counts no micro-step.
    ///
    /// # Errors
    /// As [`Engine::micro_step`]; a program that writes gradients.
    pub fn forward<M: Model>(
        &mut self,
        program: &Program<M::Op>,
        model: &mut M,
    ) -> Result<(), M::Error> {
        if !program.is_forward_only() {
            return Err(Error::BadProgram(
                "Engine::forward runs forward-only programs, and this one writes gradients".into(),
            )
            .into());
        }
        self.run_program(program, model)
    }

    fn run_program<M: Model>(
        &mut self,
        program: &Program<M::Op>,
        model: &mut M,
    ) -> Result<(), M::Error> {
        let id = self.declared.find(program.schedule()).ok_or_else(|| {
            Error::BadProgram(format!(
                "rank {} ran a program it did not declare when its engine started (the memory \
                 plan and the peers' calls follow the declared programs)",
                self.rank()
            ))
        })?;
        let result = self.run_declared(id, program, model);
        self.declared.set_cursor(None);
        let dropped = self.drop_reads_ahead();
        if result.is_err() {
            self.let_go_after_failure();
        }
        result.and(dropped.map_err(Into::into))
    }

    fn run_declared<M: Model>(
        &mut self,
        id: usize,
        program: &Program<M::Op>,
        model: &mut M,
    ) -> Result<(), M::Error> {
        let mut made = 0;
        for (i, op) in program.ops().iter().enumerate() {
            let upto = program.calls_before(i);
            self.make_calls(id, made..upto)?;
            made = upto;
            let start = Instant::now();
            model.run(&op.kind, &mut OpUnits::new(self, op))?;
            self.trace_span(Lane::Compute, start, || format!("{:?}", op.kind));
        }
        self.make_calls(id, made..self.declared.len(id))?;
        Ok(())
    }

    /// Makes calls `range` of declared program `id`.
    fn make_calls(&mut self, id: usize, range: std::ops::Range<usize>) -> Result<()> {
        for at in range {
            self.declared.set_cursor(Some((id, at)));
            let (call, start) = (self.declared.call(id, at), Instant::now());
            match call {
                Call::Gather(u) => self.gather(u)?,
                Call::Release(u) => self.release(u)?,
                Call::BeginBackward(u) => self.begin_backward(u)?,
                Call::EndBackward(u) => self.end_backward(u)?,
                kept => self.kept.call(&mut self.arena, self.tp.as_ref(), kept)?,
            }
            self.trace_span(Lane::Engine, start, || call.to_string());
            self.trace_after_call();
        }
        Ok(())
    }

    /// `unit`'s whole parameters as an operation reads them (f32, widened from half
    /// precision), all-gathered where sharded: for checks between steps. Collective where
    /// parameters are sharded: every rank calls it for the same units in the same order.
    ///
    /// # Errors
    /// [`Error::NoSuchUnit`], memory and communication failures.
    pub fn read_params(&mut self, unit: usize) -> Result<Vec<f32>> {
        self.check_unit(unit)?;
        self.complete_reductions(0)?;
        self.drop_prefetches()?;
        self.gather(unit)?;
        let values = self.params(unit).map(<[f32]>::to_vec);
        self.release(unit)?;
        values
    }

    /// Frees every prefetch, gathered copy and open gradient a failed program left (the
    /// reductions already launched complete at the next call). Errors here are dropped: the
    /// failure being returned is the one that matters.
    fn let_go_after_failure(&mut self) {
        let _ = self.drop_prefetches();
        let _ = self.kept.let_go(&mut self.arena);
        for unit in 0..self.units.bufs.len() {
            let b = &mut self.units.bufs[unit];
            b.gather_refs = 0;
            let held = [b.gathered.take(), b.unreduced.take()];
            for h in held.into_iter().flatten() {
                let _ = self.arena.free(h);
            }
        }
    }
}
