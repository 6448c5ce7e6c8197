//! The seam between a model and the engine: the model declares its micro-step as a
//! [`Program`](crate::Program) of its own operations and runs each one when the engine asks
//! ([`Model::run`]), on views of exactly the units the operation declared ([`OpUnits`]).

use super::engine::{Engine, UnitViews};
use super::error::{Error, Result};
#[cfg(feature = "cuda")]
use zero_alloc::{DeviceView, DeviceViewMut};

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
    /// An arena without host memory (`OpUnits::device_views`, feature `cuda`, views a CUDA
    /// arena).
    pub fn views(&mut self) -> Result<UnitViews<'_>> {
        self.engine.views(self.reads, self.writes)
    }

    /// `unit`'s whole f32 parameters (its `numel` elements) on a CUDA arena, borrowed for as
    /// long as the operation's units are.
    ///
    /// # Errors
    /// A unit the operation does not read; an arena without device memory.
    #[cfg(feature = "cuda")]
    pub fn device_param(&self, unit: usize) -> Result<DeviceView<'_>> {
        self.check_read(unit)?;
        let block = self.engine.param_block(unit)?;
        let numel = self.engine.units.specs[unit].numel;
        Ok(self
            .engine
            .arena
            .device_view(block)?
            .range::<f32>(0..numel)?)
    }

    /// [`OpUnits::views`] on a CUDA arena: the parameters read (shared) and the unreduced
    /// gradients written (exclusive), f32, each unit's `numel` elements. The arena's claim
    /// check refuses a block asked for twice where one view is exclusive.
    ///
    /// # Errors
    /// An arena without device memory; a block asked for twice (a broken engine invariant:
    /// a program's operation writes a unit at most once, and gradients are blocks of their
    /// own).
    #[cfg(feature = "cuda")]
    pub fn device_views(&mut self) -> Result<(Vec<DeviceView<'_>>, Vec<DeviceViewMut<'_>>)> {
        let (params, grads) = self.engine.unit_spans(self.reads, self.writes)?;
        let mut views = self.engine.arena.views();
        let p = params
            .into_iter()
            .map(|s| Ok(views.device(s.block)?.range::<f32>(s.range())?))
            .collect::<Result<Vec<_>>>()?;
        let g = grads
            .into_iter()
            .map(|s| Ok(views.device_mut(s.block)?.range::<f32>(s.range())?))
            .collect::<Result<Vec<_>>>()?;
        Ok((p, g))
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
