//! The seam between a model and the engine: the model declares its micro-step as a
//! [`Program`](crate::Program) of its own operations and runs each one when the engine asks
//! ([`Model::run`]), on views of exactly the units the operation declared ([`OpUnits`]).

use super::engine::{Engine, UnitViews};
use super::error::{Error, Result};
use super::planning::program::Op;
#[cfg(feature = "cuda")]
use zero_alloc::{DeviceView, DeviceViewMut};

/// A model the engine drives: it runs one of its operations at a time.
///
/// The model keeps whatever its operations share (activations, inputs, the loss) in
/// `self`; the engine hands each operation the units it declared, gathered and with their
/// gradients open, and does every gather, release, prefetch and reduction around it.
pub trait Model {
    /// The model's description of one operation ([`crate::Op::kind`]); its `Debug` form
    /// names the operation in a timeline ([`crate::Engine::start_trace`]).
    type Op: std::fmt::Debug;
    /// The model's errors; engine errors convert into it.
    type Error: From<Error>;

    /// Runs `op`, reading the parameters and adding into the gradients of `units`.
    ///
    /// # Errors
    /// The model's own (bad inputs, kernel failures) and the engine's (asking for a unit
    /// the operation did not declare).
    fn run(&mut self, op: &Self::Op, units: &mut OpUnits<'_>) -> Result<(), Self::Error>;
}

/// The units of one running operation: the parameters it declared it reads, the gradients
/// it declared it writes, and the kept inputs it declared it keeps or restores, nothing else.
#[derive(Debug)]
pub struct OpUnits<'e> {
    engine: &'e mut Engine,
    reads: &'e [usize],
    writes: &'e [usize],
    keeps: Option<usize>,
    restores: Option<usize>,
}

impl<'e> OpUnits<'e> {
    pub(crate) fn new<K>(engine: &'e mut Engine, op: &'e Op<K>) -> Self {
        Self {
            engine,
            reads: &op.reads,
            writes: &op.writes,
            keeps: op.keeps,
            restores: op.restores,
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

    /// The kept input the operation keeps, as declared.
    pub fn keeps(&self) -> Option<usize> {
        self.keeps
    }

    /// The kept input the operation restores, as declared.
    pub fn restores(&self) -> Option<usize> {
        self.restores
    }

    /// The tensor-parallel group the engine was told ([`Engine::with_tensor_parallel`]),
    /// if any: for the model's own collectives inside an operation (the sums over the
    /// group of a split layer's partial outputs), which the engine does not derive.
    pub fn tensor_parallel(&self) -> Option<&zero_comm::Communicator> {
        self.engine.tp.as_ref()
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

    /// The memory to write the declared kept input into (f32, its declared length), on a
    /// host arena: what a later operation restoring it reads.
    ///
    /// # Errors
    /// An operation that keeps nothing; an arena without host memory.
    pub fn kept_mut(&mut self) -> Result<&mut [f32]> {
        let block = self.kept_block(true)?;
        let len = self.engine.config.kept_inputs.len;
        let whole = self.engine.arena.slice_mut::<f32>(block)?;
        // A partitioned store's buffer is padded to whole slices past the input.
        let block_len = whole.len();
        whole
            .get_mut(..len)
            .ok_or_else(|| short_block(block_len, len))
    }

    /// The declared restored input (f32, its declared length), on a host arena: what the
    /// operation that kept it wrote.
    ///
    /// # Errors
    /// An operation that restores nothing; an arena without host memory.
    pub fn restored(&self) -> Result<&[f32]> {
        let block = self.kept_block(false)?;
        let len = self.engine.config.kept_inputs.len;
        let whole = self.engine.arena.slice::<f32>(block)?;
        whole
            .get(..len)
            .ok_or_else(|| short_block(whole.len(), len))
    }

    /// [`OpUnits::kept_mut`] on a CUDA arena.
    ///
    /// # Errors
    /// As [`OpUnits::kept_mut`]; an arena without device memory.
    #[cfg(feature = "cuda")]
    pub fn device_kept_mut(&mut self) -> Result<DeviceViewMut<'_>> {
        let block = self.kept_block(true)?;
        let len = self.engine.config.kept_inputs.len;
        let view = self.engine.arena.views().device_mut(block)?;
        Ok(view.range::<f32>(0..len)?)
    }

    /// [`OpUnits::restored`] on a CUDA arena.
    ///
    /// # Errors
    /// As [`OpUnits::restored`]; an arena without device memory.
    #[cfg(feature = "cuda")]
    pub fn device_restored(&self) -> Result<DeviceView<'_>> {
        let block = self.kept_block(false)?;
        let len = self.engine.config.kept_inputs.len;
        Ok(self.engine.arena.device_view(block)?.range::<f32>(0..len)?)
    }

    /// The block of the kept input the operation writes (`writing`) or reads.
    fn kept_block(&self, writing: bool) -> Result<zero_alloc::Handle> {
        let (declared, what) = match writing {
            true => (self.keeps, "keeps"),
            false => (self.restores, "restores"),
        };
        let k = declared.ok_or_else(|| {
            Error::Order(format!(
                "an operation asked for the kept input it {what} but declared none"
            ))
        })?;
        self.engine.kept.block(k, writing)
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

/// A kept input's block shorter than the declared length (a broken store invariant).
fn short_block(block: usize, len: usize) -> Error {
    Error::Order(format!(
        "a kept input's block holds {block} f32, fewer than its declared {len}"
    ))
}
