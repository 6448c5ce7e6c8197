//! The bundled GPT driven through the ZeRO engine: its units registered, each micro-step's
//! forward and backward bracketed unit by unit so the engine decides when parameters exist
//! and when gradients are reduced.
//!
//! The tied embedding (unit 0) is used at both ends of the pass, and each use is bracketed on
//! its own: gathered for the embedding's forward and released; gathered again for the LM
//! head and its backward down to its input, then released; the head's part of d(wte), which
//! needs no parameters, then goes into a fresh gradient buffer reduced at once (so wte and
//! its whole gradient are never held together);
//! the encoder's backward at the very end opens a second gradient buffer for unit 0 and
//! reduces it, the engine adding both reduced parts to the shard this rank keeps. So no
//! whole copy of unit 0, parameters or gradient, lives across the blocks at stage 3. Every
//! stage runs this same sequence, so every stage sums the same two parts in the same order.
//! The whole sequence is declared to the engine ([`gpt_schedule`]), which plans the step's
//! memory by replaying it and refuses a step that departs from it.

mod placement;
mod schedule;

use crate::offload::staging_slots;
pub use placement::{Placement, Views};
pub use schedule::gpt_schedule;
use zero::{Engine, EngineConfig, EngineOps, UnitSpec};
use zero_alloc::DEFAULT_ALIGNMENT;
use zero_gpt::{
    activation_buffers, Activations, Backend, Gpt, GptConfig, GptError, ParamLayout, UnitKind,
    KEPT_INPUTS,
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
}

/// The engine's view of the model's units: sizes, names, and where weight decay applies.
pub fn gpt_units(layout: &ParamLayout) -> Vec<UnitSpec> {
    layout
        .units()
        .iter()
        .map(|unit| {
            let name = match unit.kind {
                UnitKind::Embedding => "embeddings".to_string(),
                UnitKind::Block { layer } => format!("block {layer}"),
                UnitKind::FinalNorm => "final norm".to_string(),
            };
            unit.tensors
                .iter()
                .filter(|t| t.weight_decay)
                .fold(UnitSpec::new(name, unit.len), |spec, t| {
                    spec.with_decay(t.offset..t.offset + t.len)
                })
        })
        .collect()
}

/// An engine for the GPT laid out as `layout`: its units registered and its micro-step
/// declared ([`gpt_schedule`], checkpointing every `checkpoint_every` blocks or none), with
/// `init(unit, whole_unit)` filling the parameters.
///
/// # Errors
/// As [`Engine::with_schedule`].
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
    let schedule = gpt_schedule(layout, checkpoint_every);
    Engine::with_ops(comm, gpt_units(layout), &schedule, config, ops, init)
}

/// Where a micro-batch's activations live, and how many are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ActivationPlacement {
    /// Activation checkpointing every K blocks, or `None`.
    pub checkpoint_every: Option<usize>,
    /// The kept block inputs live in pinned host memory, staged through
    /// [`crate::offload::STAGING_SLOTS`] inputs in the rank's arena.
    pub offload: bool,
    /// f32 elements of the model backend's kernel scratch ([`Backend::scratch_len`]), lent
    /// from the arena with the activations: 0 on the CPU; set by
    /// [`ActivationPlacement::with_scratch_of`].
    pub backend_scratch: usize,
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
/// buffers ([`zero_gpt::activation_buffers`]), with offload the staging slots in place of the
/// kept inputs, and the backend's kernel scratch (`placement.backend_scratch`), each rounded
/// up to the arena's alignment: exactly what [`arena_activations`] lends when the placement
/// was made [`with_scratch_of`](ActivationPlacement::with_scratch_of) the model's backend.
/// What [`EngineConfig::activation_bytes`](zero::EngineConfig) declares.
///
/// # Errors
/// A batch shape the model refuses.
pub fn activation_arena_bytes(
    config: &GptConfig,
    b: usize,
    t: usize,
    placement: ActivationPlacement,
) -> Result<u64, GptError> {
    let align = DEFAULT_ALIGNMENT as u64;
    let aligned = |len: usize| (len as u64 * 4).div_ceil(align) * align;
    let buffers = activation_buffers(config, b, t, placement.checkpoint_every)?;
    let (segments, input_len) = kept_shape(config, b, t, buffers[KEPT_INPUTS]);
    let model_buffers: u64 = buffers
        .iter()
        .enumerate()
        .map(|(i, &len)| match i {
            KEPT_INPUTS if placement.offloads() => {
                staging_slots(segments) as u64 * aligned(input_len)
            }
            _ => aligned(len),
        })
        .sum();
    Ok(model_buffers + aligned(placement.backend_scratch))
}

/// (segments, N*C) of kept inputs of `kept_len` floats.
fn kept_shape(config: &GptConfig, b: usize, t: usize, kept_len: usize) -> (usize, usize) {
    // B*T*C was checked not to overflow by `activation_buffers`.
    let input_len = b * t * config.channels;
    (kept_len / input_len, input_len)
}

/// Activations whose every buffer is a block of `engine`'s arena, lent for good: the arena
/// holds, caps and counts them with the model states, and the backend's kernel scratch
/// ([`zero_gpt::BACKEND_SCRATCH`], handed to the backend by the model); with
/// `placement.offload`, the kept block inputs go to pinned host memory through staging
/// slots of the arena ([`crate::offload`]). The scratch lent is what the backend asks for:
/// a plan whose `placement.backend_scratch` is smaller makes the engine refuse the loan. (The model takes its memory from a caller-supplied allocator and
/// knows no arena; the engine lends blocks and knows no model: this glue is the one place
/// that knows both.)
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
    let (config, every) = (model.config(), placement.checkpoint_every);
    let kept = if placement.offloads() {
        let kept_len = activation_buffers(config, b, t, every)?[KEPT_INPUTS];
        let (segments, input_len) = kept_shape(config, b, t, kept_len);
        Some(
            model
                .backend()
                .offloaded_kept(engine, segments, input_len)?,
        )
    } else {
        None
    };
    let lend = |_, len| B::lend(engine, len).map_err(StepError::from);
    Activations::with_backend_memory(model.backend(), config, b, t, every, lend, kept)
}

/// Forward through every unit; with targets, returns this rank's mean loss.
///
/// Leaves the final norm and the embedding gathered for the head (released by [`backward`]
/// or by the caller).
fn forward<B: Placement>(
    engine: &mut Engine,
    model: &Gpt<B>,
    acts: &mut Activations<B>,
    tokens: &[u32],
    targets: Option<&[u32]>,
) -> Result<Option<f32>, StepError> {
    let last = model.layout().final_norm_unit();
    engine.gather(0)?;
    model.embed_forward(acts, B::params(engine, 0)?, tokens)?;
    engine.release(0)?;
    for layer in 0..model.config().num_layers {
        let unit = ParamLayout::block_unit(layer);
        engine.gather(unit)?;
        model.block_forward(acts, layer, B::params(engine, unit)?)?;
        engine.release(unit)?;
    }
    engine.gather(last)?;
    engine.gather(0)?;
    let (wf, wte) = (B::params(engine, last)?, B::params(engine, 0)?);
    let loss = model.head_forward(acts, wf, wte, targets)?;
    Ok(loss)
}

/// Backward in reverse unit order, each unit's gradient reduced as soon as it is complete:
/// the embedding's twice, its head part first and its encoder part last.
fn backward<B: Placement>(
    engine: &mut Engine,
    model: &Gpt<B>,
    acts: &mut Activations<B>,
) -> Result<(), StepError> {
    let last = model.layout().final_norm_unit();
    engine.begin_backward(last)?;
    {
        let (p, mut g) = B::views(engine, &[last, 0], &[last])?;
        model.head_backward_input(acts, p[0], p[1], g[0])?;
    }
    engine.end_backward(last)?;
    engine.release(last)?;
    engine.release(0)?;
    engine.begin_backward(0)?;
    {
        let (_, mut g) = B::views(engine, &[], &[0])?;
        model.head_backward_weight(acts, g[0])?;
    }
    engine.end_backward(0)?;
    for layer in (0..model.config().num_layers).rev() {
        let unit = ParamLayout::block_unit(layer);
        if acts.needs_recompute(layer) {
            recompute_segment(engine, model, acts, layer)?;
        } else {
            engine.gather(unit)?;
        }
        engine.begin_backward(unit)?;
        {
            let (p, mut g) = B::views(engine, &[unit], &[unit])?;
            model.block_backward(acts, layer, p[0], g[0])?;
        }
        engine.end_backward(unit)?;
        engine.release(unit)?;
    }
    engine.begin_backward(0)?;
    {
        let (_, mut g) = B::views(engine, &[], &[0])?;
        model.embed_backward(acts, g[0])?;
    }
    engine.end_backward(0)?;
    Ok(())
}

/// Activation checkpointing: runs forward again the blocks of `last`'s segment, each
/// gathered in turn, and leaves `last` (the segment's last block, due for backward) gathered.
fn recompute_segment<B: Placement>(
    engine: &mut Engine,
    model: &Gpt<B>,
    acts: &mut Activations<B>,
    last: usize,
) -> Result<(), StepError> {
    for layer in acts.segment(last) {
        let unit = ParamLayout::block_unit(layer);
        engine.gather(unit)?;
        model.block_recompute(acts, layer, B::params(engine, unit)?)?;
        if layer != last {
            engine.release(unit)?;
        }
    }
    Ok(())
}

/// One training micro-step on this rank's (B, T) batch: forward, backward, and the
/// reductions of every unit's gradient. Returns this rank's mean loss.
///
/// # Errors
/// Model errors (bad tokens, shapes) and engine errors (memory, communication, order).
pub fn micro_step<B: Placement>(
    engine: &mut Engine,
    model: &Gpt<B>,
    acts: &mut Activations<B>,
    tokens: &[u32],
    targets: &[u32],
) -> Result<f32, StepError> {
    let loss = forward(engine, model, acts, tokens, Some(targets))?.unwrap_or(f32::NAN);
    backward(engine, model, acts)?;
    engine.end_micro_step()?;
    Ok(loss)
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
    engine.without_order_check(|engine| {
        let loss = forward(engine, model, acts, tokens, Some(targets))?;
        engine.release(model.layout().final_norm_unit())?;
        engine.release(0)?;
        Ok(loss.unwrap_or(f32::NAN))
    })
}

/// Runs `f` on the logits (B, T, Vp) of a forward pass without targets (sampling).
///
/// # Errors
/// As [`micro_step`].
pub fn with_logits<B: Placement, R>(
    engine: &mut Engine,
    model: &Gpt<B>,
    acts: &mut Activations<B>,
    tokens: &[u32],
    f: impl FnOnce(&[f32]) -> R,
) -> Result<R, StepError> {
    engine.without_order_check(|engine| {
        forward(engine, model, acts, tokens, None)?;
        let out = f(&model.backend().to_host(model.logits(acts)?)?);
        let last = model.layout().final_norm_unit();
        engine.release(last)?;
        engine.release(0)?;
        Ok(out)
    })
}

/// Every unit's whole parameters (for checkpoints and tests); gathers at stage 3.
///
/// # Errors
/// Engine errors.
pub fn full_params(engine: &mut Engine) -> Result<Vec<Vec<f32>>, zero::Error> {
    engine.without_order_check(|engine| {
        (0..engine.units().len())
            .map(|unit| {
                engine.gather(unit)?;
                let values = engine.params(unit)?.to_vec();
                engine.release(unit)?;
                Ok(values)
            })
            .collect()
    })
}
