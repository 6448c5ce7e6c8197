//! The bundled GPT driven through the ZeRO engine: its units registered, its passes declared
//! as programs of zero-gpt's model calls ([`GptPrograms`]), and each call run on the units
//! the engine hands it ([`GptPass`]); the engine derives when parameters exist and when
//! gradients are reduced.
//!
//! The tied embedding (unit 0) is used at both ends of the pass: read by the embedding's
//! forward, then released; read again by the LM head's forward and its backward down to its
//! input, then released; the head's part of d(wte), which needs no parameters, goes into a
//! fresh gradient buffer reduced at once (so wte and its whole gradient are never held
//! together); the encoder's backward at the very end opens a second gradient buffer for
//! unit 0 and reduces it, the engine adding both reduced parts to the shard this rank keeps.
//! So no whole copy of unit 0, parameters or gradient, lives across the blocks at stage 3.
//! Every stage runs this same program, so every stage sums the same two parts in the same
//! order.

mod placement;
mod split;
mod split_vocab;

pub use placement::{Placement, Views};
pub use split::{tp_forward_ops, tp_program, tp_train_program, TpPrograms};
use zero::{
    Engine, EngineConfig, EngineOps, KeptInputs, Model, Op, OpUnits, Program, Schedule, UnitSpec,
};
use zero_alloc::DEFAULT_ALIGNMENT;
use zero_gpt::{
    activation_buffers, forward_ops, train_ops, Activations, Backend, CpuBackend, Gpt, GptConfig,
    GptError, GptOp, KeptBy, ParamLayout, TpOp, UnitKind, KEPT_INPUTS,
};

/// Why a GPT micro-step failed.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    /// The engine (memory, communication, order) failed.
    #[error(transparent)]
    Engine(#[from] zero::Error),
    /// The model refused its inputs.
    #[error(transparent)]
    Model(#[from] GptError),
    /// A pass that was to compute the loss ran no loss operation: a program built without
    /// targets, run as a training or evaluation step.
    #[error("the micro-step computed no loss: its program has no loss operation (built without targets?)")]
    NoLoss,
}

/// The layout one rank of a tensor-parallel group of `t` trains: at `t` > 1 the blocks and
/// the vocabulary split Megatron's way ([`ParamLayout::split_vocab`], the layout of
/// [`Gpt::with_vocab_parallel`], which the trainer builds), at 1 the whole model.
pub fn split_layout(model: &GptConfig, t: usize) -> ParamLayout {
    match t {
        0 | 1 => ParamLayout::new(model),
        t => ParamLayout::split_vocab(model, t),
    }
}

/// The engine's view of the model's units: sizes, names, where weight decay applies, and,
/// in a layout split over a tensor-parallel group, which units are this rank's slices
/// ([`UnitSpec::tp_sharded`]: the blocks' attention and MLP slices and the embedding's
/// rows; the rest is the same on every rank of the group).
pub fn gpt_units(layout: &ParamLayout) -> Vec<UnitSpec> {
    layout
        .units()
        .iter()
        .map(|unit| {
            let name = match unit.kind {
                UnitKind::Embedding => "embeddings".to_string(),
                UnitKind::Block { layer } => format!("block {layer}"),
                UnitKind::FinalNorm => "final norm".to_string(),
                // A layout split over a tensor-parallel group.
                UnitKind::AttentionSlice { layer } => format!("block {layer} attention slice"),
                UnitKind::MlpSlice { layer } => format!("block {layer} MLP slice"),
                UnitKind::BlockReplicated { layer } => format!("block {layer} replicated"),
                UnitKind::EmbeddingSlice => "embeddings slice".to_string(),
                UnitKind::Positions => "position embeddings".to_string(),
            };
            let spec = match unit.kind.is_slice() {
                true => UnitSpec::new(name, unit.len).tp_sharded(),
                false => UnitSpec::new(name, unit.len),
            };
            unit.tensors
                .iter()
                .filter(|t| t.weight_decay)
                .fold(spec, |spec, t| spec.with_decay(t.offset..t.offset + t.len))
        })
        .collect()
}

/// An engine for the GPT laid out as `layout`: its units registered and its programs
/// declared ([`GptPrograms`], checkpointing every `checkpoint_every` blocks or none), with
/// `init(unit, whole_unit)` filling the parameters.
///
/// # Errors
/// As [`Engine::new`].
pub fn gpt_engine(
    comm: zero_comm::Communicator,
    layout: &ParamLayout,
    checkpoint_every: Option<usize>,
    config: EngineConfig,
    init: impl FnMut(usize, &mut [f32]),
) -> Result<Engine, zero::Error> {
    gpt_engine_on(
        comm,
        layout,
        checkpoint_every,
        config,
        EngineOps::host(),
        init,
    )
}

/// As [`gpt_engine`], with the model states on `ops` ([`Engine::with_ops`]).
///
/// # Errors
/// As [`Engine::with_ops`].
pub fn gpt_engine_on(
    comm: zero_comm::Communicator,
    layout: &ParamLayout,
    checkpoint_every: Option<usize>,
    config: EngineConfig,
    ops: EngineOps,
    init: impl FnMut(usize, &mut [f32]),
) -> Result<Engine, zero::Error> {
    let units = gpt_units(layout);
    if layout.tensor_parallel() > 1 {
        let programs = TpPrograms::new(layout, checkpoint_every)?;
        return Engine::with_ops(comm, units, &programs.schedules(), config, ops, init);
    }
    let programs = GptPrograms::new(layout, checkpoint_every)?;
    Engine::with_ops(comm, units, &programs.schedules(), config, ops, init)
}

/// Where a micro-batch's activations live, and how many are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ActivationPlacement {
    /// Activation checkpointing every K blocks, or `None`.
    pub checkpoint_every: Option<usize>,
    /// The kept block inputs live in pinned host memory, staged through
    /// [`zero::STAGING_SLOTS`] inputs in the rank's arena (the engine's store).
    pub offload: bool,
    /// f32 elements of the model backend's kernel scratch ([`Backend::scratch_len`]), lent
    /// from the arena with the activations: 0 on the CPU; set by
    /// [`ActivationPlacement::with_scratch_of`].
    pub backend_scratch: usize,
    /// Ranks of the tensor-parallel group each kept block input is partitioned over
    /// (ZeRO-R's P_a, `--partition-activations`: a slice per rank, all-gathered before its
    /// recompute); 0 or 1: kept whole.
    pub partitions: usize,
}

impl ActivationPlacement {
    /// This placement with the scratch `backend` needs for (B, T) batches of `config`.
    ///
    /// # Errors
    /// A batch shape the backend refuses.
    pub fn with_scratch_of<B: Backend>(
        self,
        backend: &B,
        config: &GptConfig,
        b: usize,
        t: usize,
    ) -> Result<Self, GptError> {
        Ok(Self {
            backend_scratch: backend.scratch_len(config, b, t)?,
            ..self
        })
    }

    /// Kept inputs exist (checkpointing on) and are offloaded.
    fn offloads(self) -> bool {
        self.offload && self.checkpoint_every.is_some()
    }
}

/// Bytes the activations of one (B, T) micro-batch take in a rank's arena: the model's
/// buffers ([`zero_gpt::activation_buffers`]) but the kept inputs, which the engine holds
/// ([`kept_inputs`]), and the backend's kernel scratch (`placement.backend_scratch`), each
/// rounded up to the arena's alignment: exactly what [`arena_activations`] lends when the
/// placement was made [`with_scratch_of`](ActivationPlacement::with_scratch_of) the model's
/// backend. What [`EngineConfig::activation_bytes`](zero::EngineConfig) declares.
///
/// # Errors
/// A batch shape the model refuses.
pub fn activation_arena_bytes(
    config: &GptConfig,
    b: usize,
    t: usize,
    placement: ActivationPlacement,
) -> Result<u64, GptError> {
    let buffers = activation_buffers(config, b, t, placement.checkpoint_every)?;
    Ok(arena_bytes_of(buffers, placement))
}

/// [`activation_arena_bytes`] of `model`'s buffers ([`Gpt::activation_buffers`]): split
/// over a tensor-parallel group, this rank's (its heads' and MLP columns' share); whole,
/// the same bytes.
///
/// # Errors
/// A batch shape the model refuses.
pub fn model_activation_arena_bytes<B: Backend>(
    model: &Gpt<B>,
    b: usize,
    t: usize,
    placement: ActivationPlacement,
) -> Result<u64, GptError> {
    let buffers = model.activation_buffers(b, t, placement.checkpoint_every)?;
    Ok(arena_bytes_of(buffers, placement))
}

/// The arena bytes of activation `buffers` (f32 elements, [`zero_gpt::BUFFER_NAMES`] order)
/// but the kept inputs, and of the backend scratch of `placement`, each aligned.
fn arena_bytes_of(buffers: [usize; 6], placement: ActivationPlacement) -> u64 {
    let align = DEFAULT_ALIGNMENT as u64;
    let aligned = |len: usize| (len as u64 * 4).div_ceil(align) * align;
    let model_buffers: u64 = buffers
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != KEPT_INPUTS)
        .map(|(_, &len)| aligned(len))
        .sum();
    model_buffers + aligned(placement.backend_scratch)
}

/// How the engine stores the kept block inputs of (B, T) micro-batches placed as `placement`
/// says: each one (N,C) input, offloaded or not, partitioned or not. What
/// [`EngineConfig::kept_inputs`](zero::EngineConfig) declares.
///
/// # Errors
/// A batch shape the model refuses.
pub fn kept_inputs(
    config: &GptConfig,
    b: usize,
    t: usize,
    placement: ActivationPlacement,
) -> Result<KeptInputs, GptError> {
    // Checks that B*T*C does not overflow, among the rest of the batch shape.
    activation_buffers(config, b, t, placement.checkpoint_every)?;
    Ok(KeptInputs {
        len: b * t * config.channels,
        offload: placement.offloads(),
        partitions: placement.partitions,
    })
}

/// Activations whose every buffer is a block of `engine`'s arena, lent for good: the arena
/// holds, caps and counts them with the model states, and the backend's kernel scratch
/// ([`zero_gpt::BACKEND_SCRATCH`], handed to the backend by the model). The kept block inputs
/// are the engine's ([`KeptBy::Caller`]): each recomputed segment's input is a kept input of
/// the training program, in the arena or, with `placement.offload`, in pinned host memory.
/// The scratch lent is what the backend asks for: a plan whose `placement.backend_scratch`
/// is smaller makes the engine refuse the loan. (The model takes its memory from a
/// caller-supplied allocator and knows no arena; the engine lends blocks and knows no model:
/// this glue is the one place that knows both.)
///
/// # Errors
/// A batch shape the model refuses; arena errors (a cap too small).
pub fn arena_activations<B: Placement>(
    engine: &mut Engine,
    model: &Gpt<B>,
    b: usize,
    t: usize,
    placement: ActivationPlacement,
) -> Result<Activations<B>, StepError> {
    let lend = |_, len| B::lend(engine, len).map_err(StepError::from);
    model.activations_with_memory((b, t), placement.checkpoint_every, lend, KeptBy::Caller)
}

/// Activations of the CPU backend in heap memory, outside the engine's arena (which then
/// neither caps nor counts them), their kept inputs the engine's ([`KeptBy::Caller`]), as
/// [`micro_step`] needs them with checkpointing every `every` blocks.
///
/// # Errors
/// A batch shape the model refuses.
pub fn heap_activations(
    config: &GptConfig,
    b: usize,
    t: usize,
    every: Option<usize>,
) -> Result<Activations, GptError> {
    let heap = |_, len| Ok::<_, GptError>(Box::new(vec![0f32; len]) as zero_gpt::Buffer);
    Activations::with_backend_memory(&CpuBackend, config, b, t, every, heap, KeptBy::Caller)
}

/// The programs of the GPT laid out as `layout`, checkpointing every `checkpoint_every`
/// blocks or none: its training micro-step and its forward pass (evaluation, sampling),
/// from zero-gpt's declaration ([`zero_gpt::train_ops`], [`zero_gpt::forward_ops`]).
#[derive(Debug, Clone)]
pub struct GptPrograms {
    /// One training micro-step.
    pub train: Program<GptOp>,
    /// One forward pass, no gradients.
    pub forward: Program<GptOp>,
}

impl GptPrograms {
    /// The programs of `layout` with checkpointing every `checkpoint_every` blocks or none.
    ///
    /// # Errors
    /// A layout whose units do not match its layers (a broken invariant).
    pub fn new(layout: &ParamLayout, checkpoint_every: Option<usize>) -> Result<Self, zero::Error> {
        let layers = layout.final_norm_unit() - 1;
        let every = checkpoint_every;
        Ok(Self {
            train: gpt_program(layout, train_ops(layers, every), every)?,
            // A forward pass keeps nothing: nothing is recomputed after it.
            forward: gpt_program(layout, forward_ops(layers), None)?,
        })
    }

    /// Both programs' calls, as the engine is told them at start-up.
    pub fn schedules(&self) -> [&Schedule; 2] {
        [self.train.schedule(), self.forward.schedule()]
    }
}

/// The program of `ops` on the GPT laid out as `layout`, checkpointing every `every` blocks
/// or none: each call with the units it reads and writes ([`GptOp::reads`],
/// [`GptOp::writes`]) and the segment input it keeps or restores ([`GptOp::keeps`],
/// [`GptOp::restores`]).
///
/// # Errors
/// A call naming a layer the layout does not have; kept inputs out of order.
pub fn gpt_program(
    layout: &ParamLayout,
    ops: Vec<GptOp>,
    every: Option<usize>,
) -> Result<Program<GptOp>, zero::Error> {
    let layers = layout.final_norm_unit() - 1;
    let ops = ops
        .into_iter()
        .map(|op| {
            let mut declared = Op::new(op)
                .reads(op.reads(layers))
                .writes(op.writes(layers));
            declared.keeps = op.keeps(layers, every);
            declared.restores = op.restores(layers, every);
            declared
        })
        .collect();
    Program::new(ops, layout.units().len()).map_err(zero::Error::BadProgram)
}

/// One pass of the GPT on one batch, as the engine runs it: each [`GptOp`] is the model
/// call of the same name on the units the engine hands it.
struct GptPass<'m, B: Backend> {
    model: &'m Gpt<B>,
    acts: &'m mut Activations<B>,
    tokens: &'m [u32],
    targets: Option<&'m [u32]>,
    /// The head's mean loss (with targets).
    loss: Option<f32>,
}

impl<B: Placement> Model for GptPass<'_, B> {
    type Op = GptOp;
    type Error = StepError;

    fn run(&mut self, op: &GptOp, units: &mut OpUnits<'_>) -> Result<(), StepError> {
        let (model, acts) = (self.model, &mut *self.acts);
        let block = ParamLayout::block_unit;
        match *op {
            GptOp::Embed => model.embed_forward(acts, B::params(units, 0)?, self.tokens)?,
            GptOp::Block(l) => {
                model.block_forward(acts, l, B::params(units, block(l))?)?;
                if units.keeps().is_some() {
                    model.keep_input(acts, l, B::kept_mut(units)?)?;
                }
            }
            GptOp::Recompute(l) => {
                if units.restores().is_some() {
                    model.restore_input(acts, l, B::restored(units)?)?;
                }
                model.block_recompute(acts, l, B::params(units, block(l))?)?;
            }
            GptOp::Head => {
                let last = model.layout().final_norm_unit();
                let (wf, wte) = (B::params(units, last)?, B::params(units, 0)?);
                self.loss = model.head_forward(acts, wf, wte, self.targets)?;
            }
            GptOp::HeadBackwardInput => {
                let (p, mut g) = B::views(units)?;
                model.head_backward_input(acts, p[0], p[1], g[0])?;
            }
            GptOp::HeadBackwardWeight => model.head_backward_weight(acts, B::views(units)?.1[0])?,
            GptOp::BlockBackward(l) => {
                let (p, mut g) = B::views(units)?;
                model.block_backward(acts, l, p[0], g[0])?;
            }
            GptOp::EmbedBackward => model.embed_backward(acts, B::views(units)?.1[0])?,
        }
        Ok(())
    }
}

/// One training micro-step on this rank's (B, T) batch: forward, backward, and the
/// reductions of every unit's gradient ([`TrainStep`]: of whole blocks, or split over the
/// engine's tensor-parallel group). Returns this rank's mean loss.
///
/// # Errors
/// Model errors (bad tokens, shapes) and engine errors (memory, communication).
pub fn micro_step<B: Placement>(
    engine: &mut Engine,
    model: &Gpt<B>,
    acts: &mut Activations<B>,
    tokens: &[u32],
    targets: &[u32],
) -> Result<f32, StepError> {
    let step = TrainStep::new(model.layout(), acts.checkpoint_every())?;
    step.run(engine, model, acts, tokens, targets)
}

/// As [`micro_step`], running `program`, which the engine must have been declared.
///
/// # Errors
/// As [`micro_step`]; a program the engine was not declared.
pub fn train_program<B: Placement>(
    engine: &mut Engine,
    program: &Program<GptOp>,
    model: &Gpt<B>,
    acts: &mut Activations<B>,
    tokens: &[u32],
    targets: &[u32],
) -> Result<f32, StepError> {
    let mut pass = GptPass {
        model,
        acts,
        tokens,
        targets: Some(targets),
        loss: None,
    };
    engine.micro_step(program, &mut pass)?;
    pass.loss.ok_or(StepError::NoLoss)
}

/// The training micro-step a trainer runs, built once: of whole blocks ([`GptPrograms`]), or
/// of a rank of a tensor-parallel group ([`TpPrograms`]), as the model's layout is.
#[derive(Debug, Clone)]
pub enum TrainStep {
    /// Whole blocks (T = 1).
    Whole(Program<GptOp>),
    /// Split blocks, the group's sums among the calls (T > 1).
    Split(Program<TpOp>),
}

impl TrainStep {
    /// The micro-step of the model laid out as `layout`, checkpointing every `every` blocks
    /// or none.
    ///
    /// # Errors
    /// As [`GptPrograms::new`].
    pub fn new(layout: &ParamLayout, every: Option<usize>) -> Result<Self, zero::Error> {
        Ok(if layout.tensor_parallel() > 1 {
            Self::Split(TpPrograms::new(layout, every)?.train)
        } else {
            Self::Whole(GptPrograms::new(layout, every)?.train)
        })
    }

    /// Runs the micro-step on `tokens` and `targets` ([`train_program`] or
    /// [`tp_train_program`]) and returns this rank's mean loss.
    ///
    /// # Errors
    /// As [`micro_step`].
    pub fn run<B: Placement>(
        &self,
        engine: &mut Engine,
        model: &Gpt<B>,
        acts: &mut Activations<B>,
        tokens: &[u32],
        targets: &[u32],
    ) -> Result<f32, StepError> {
        match self {
            Self::Whole(program) => train_program(engine, program, model, acts, tokens, targets),
            Self::Split(program) => tp_train_program(engine, program, model, acts, tokens, targets),
        }
    }
}

/// Runs the forward program on `tokens` (and `targets`, for a loss; without, a split model
/// stops at its head's logits).
fn forward_pass<B: Placement>(
    engine: &mut Engine,
    model: &Gpt<B>,
    acts: &mut Activations<B>,
    tokens: &[u32],
    targets: Option<&[u32]>,
) -> Result<Option<f32>, StepError> {
    if model.tensor_parallel().size > 1 {
        // The forward programs keep nothing, whatever the checkpointing.
        let programs = TpPrograms::new(model.layout(), None)?;
        let program = match targets {
            Some(_) => &programs.forward,
            None => &programs.logits,
        };
        let mut pass = split::TpPass {
            model,
            acts,
            tokens,
            targets,
            loss: None,
        };
        engine.forward(program, &mut pass)?;
        return Ok(pass.loss);
    }
    let programs = GptPrograms::new(model.layout(), acts.checkpoint_every())?;
    let mut pass = GptPass {
        model,
        acts,
        tokens,
        targets,
        loss: None,
    };
    engine.forward(&programs.forward, &mut pass)?;
    Ok(pass.loss)
}

/// The mean loss on one batch, forward only (evaluation).
///
/// # Errors
/// As [`micro_step`].
pub fn eval_loss<B: Placement>(
    engine: &mut Engine,
    model: &Gpt<B>,
    acts: &mut Activations<B>,
    tokens: &[u32],
    targets: &[u32],
) -> Result<f32, StepError> {
    forward_pass(engine, model, acts, tokens, Some(targets))?.ok_or(StepError::NoLoss)
}

/// The logits over the whole padded vocabulary (Vp floats) at position `pos` of a forward
/// pass on `tokens` without targets (sampling); with the vocabulary split over a
/// tensor-parallel group, gathered from its ranks.
///
/// # Errors
/// As [`micro_step`]; a position past the pass.
pub fn logits_at<B: Placement>(
    engine: &mut Engine,
    model: &Gpt<B>,
    acts: &mut Activations<B>,
    tokens: &[u32],
    pos: usize,
) -> Result<Vec<f32>, StepError> {
    forward_pass(engine, model, acts, tokens, None)?;
    if model.layout().vocab_parallel() {
        let tp = engine.tensor_parallel().ok_or_else(|| {
            zero::Error::Order("a split vocabulary's logits need the tensor-parallel group".into())
        })?;
        let (model, acts) = B::on_cpu(model, acts).ok_or(GptError::OutOfOrder {
            call: "logits_at",
            reason: "the vocabulary is split on the CPU only".into(),
        })?;
        return split_vocab::gather_logits_row(model, acts, tp, pos);
    }
    let vp = model.config().padded_vocab_size;
    let logits = model.backend().to_host(model.logits(acts)?)?;
    let row = logits
        .get(pos * vp..(pos + 1) * vp)
        .ok_or(GptError::OutOfOrder {
            call: "logits_at",
            reason: format!(
                "position {pos} is past the pass's {} positions",
                logits.len() / vp
            ),
        })?;
    Ok(row.to_vec())
}

/// Every unit's whole parameters as a forward pass reads them (for checks and tests);
/// gathers at stage 3.
///
/// # Errors
/// Engine errors.
pub fn full_params(engine: &mut Engine) -> Result<Vec<Vec<f32>>, zero::Error> {
    (0..engine.units().len())
        .map(|unit| engine.read_params(unit))
        .collect()
}
