//! The seam between a model and the engine: the model declares its micro-step as a
//! [`Program`](crate::Program) of its own operations and runs each one when the engine asks
//! ([`Model::run`]), on views of exactly the units the operation declared ([`OpUnits`]).

use super::engine::{Engine, UnitViews};
use super::error::{Error, Result};
use super::kernels::Span;
use zero_alloc::Arena;

/// A model the engine drives: it runs one of its operations at a time.
///
/// The model keeps whatever its operations share (activations, inputs, the loss) in
/// `self`; the engine hands each operation the units it declared, gathered and with their
/// gradients open, and does every gather, release, prefetch and reduction around it.
pub trait Model {
    /// The model's description of one operation ([`crate::Op::kind`]).
    type Op;
    /// The model's errors; engine errors convert into it.
    type Error: From<Error>;

    /// Runs `op`, reading the parameters and adding into the gradients of `units`.
    ///
    /// # Errors
    /// The model's own (bad inputs, kernel failures) and the engine's (asking for a unit
    /// the operation did not declare).
    fn run(&mut self, op: &Self::Op, units: &mut OpUnits<'_>) -> Result<(), Self::Error>;
}

/// The units of one running operation: the parameters it declared it reads and the
/// gradients it declared it writes, nothing else.
#[derive(Debug)]
pub struct OpUnits<'e> {
    engine: &'e mut Engine,
    reads: &'e [usize],
    writes: &'e [usize],
}

impl<'e> OpUnits<'e> {
    pub(crate) fn new(engine: &'e mut Engine, reads: &'e [usize], writes: &'e [usize]) -> Self {
        Self {
            engine,
            reads,
            writes,
        }
    }

    /// The units whose parameters the operation reads, as declared.
    pub fn reads(&self) -> &[usize] {
        self.reads
    }

    /// The units whose gradients the operation writes, as declared.
    pub fn writes(&self) -> &[usize] {
        self.writes
    }

    /// `unit`'s whole f32 parameters (its `numel` elements), on a host arena.
    ///
    /// # Errors
    /// A unit the operation does not read; an arena without host memory.
    pub fn params(&self, unit: usize) -> Result<&[f32]> {
        self.check_read(unit)?;
        self.engine.params(unit)
    }

    /// The parameters of every unit read and the gradients of every unit written, in the
    /// declared orders, on a host arena.
    ///
    /// # Errors
    /// An arena without host memory (use [`OpUnits::spans`] there).
    pub fn views(&mut self) -> Result<UnitViews<'_>> {
        self.engine.views(self.reads, self.writes)
    }

    /// Where [`OpUnits::views`] points, as spans of [`OpUnits::arena`]'s blocks (f32, each
    /// unit's `numel` elements), for a model computing on the arena's device. Valid while
    /// this operation runs: blocks move only inside engine calls.
    ///
    /// # Errors
    /// None for a running operation (a broken engine invariant otherwise).
    pub fn spans(&self) -> Result<(Vec<Span>, Vec<Span>)> {
        self.engine.unit_spans(self.reads, self.writes)
    }

    /// The span of `unit`'s parameters ([`OpUnits::spans`] for one unit read).
    ///
    /// # Errors
    /// A unit the operation does not read.
    pub fn param_span(&self, unit: usize) -> Result<Span> {
        self.check_read(unit)?;
        Ok(self.engine.unit_spans(&[unit], &[])?.0[0])
    }

    /// The arena whose blocks the spans name.
    pub fn arena(&self) -> &Arena {
        self.engine.arena()
    }

    fn check_read(&self, unit: usize) -> Result<()> {
        if self.reads.contains(&unit) {
            return Ok(());
        }
        Err(Error::Order(format!(
            "an operation asked for unit {unit}'s parameters but declared it reads {:?}",
            self.reads
        )))
    }
}
