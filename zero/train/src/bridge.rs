//! The bundled GPT driven through the ZeRO engine: its units registered, each micro-step's
//! forward and backward bracketed unit by unit so the engine decides when parameters exist
//! and when gradients are reduced.
//!
//! The tied LM head reads the embedding unit at the end of forward and writes its gradient
//! at the start of backward, which the embedding's own backward finishes last: so unit 0
//! stays gathered, and its unreduced gradient stays alive, for the whole micro-step.

use zero::{Engine, UnitSpec};
use zero_gpt::{Activations, Gpt, GptError, ParamLayout, UnitKind};

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
            // The tied embedding is read at both ends of the pass (see the module docs).
            let spec = match unit.kind {
                UnitKind::Embedding => UnitSpec::new(name, unit.len).spanning_micro_step(),
                _ => UnitSpec::new(name, unit.len),
            };
            unit.tensors
                .iter()
                .filter(|t| t.weight_decay)
                .fold(spec, |spec, t| spec.with_decay(t.offset..t.offset + t.len))
        })
        .collect()
}

/// Forward through every unit; with targets, returns this rank's mean loss.
///
/// Leaves the embedding unit gathered (released by [`backward`] or by the caller).
fn forward(
    engine: &mut Engine,
    model: &Gpt,
    acts: &mut Activations,
    tokens: &[u32],
    targets: Option<&[u32]>,
) -> Result<Option<f32>, StepError> {
    let last = model.layout().final_norm_unit();
    engine.gather(0)?;
    model.embed_forward(acts, engine.params(0)?, tokens)?;
    for layer in 0..model.config().num_layers {
        let unit = ParamLayout::block_unit(layer);
        engine.gather(unit)?;
        model.block_forward(acts, layer, engine.params(unit)?)?;
        engine.release(unit)?;
    }
    engine.gather(last)?;
    let loss = model.head_forward(acts, engine.params(last)?, engine.params(0)?, targets)?;
    Ok(loss)
}

/// Backward in reverse unit order, each unit's gradient reduced as soon as it is complete.
fn backward(engine: &mut Engine, model: &Gpt, acts: &mut Activations) -> Result<(), StepError> {
    let last = model.layout().final_norm_unit();
    engine.begin_backward(last)?;
    engine.begin_backward(0)?;
    {
        let (p, mut g) = engine.views(&[last, 0], &[last, 0])?;
        let (final_grad, rest) = g.split_at_mut(1);
        model.head_backward(acts, p[0], p[1], final_grad[0], rest[0])?;
    }
    engine.end_backward(last)?;
    engine.release(last)?;
    for layer in (0..model.config().num_layers).rev() {
        let unit = ParamLayout::block_unit(layer);
        if acts.needs_recompute(layer) {
            recompute_segment(engine, model, acts, layer)?;
        } else {
            engine.gather(unit)?;
        }
        engine.begin_backward(unit)?;
        {
            let (p, mut g) = engine.views(&[unit], &[unit])?;
            model.block_backward(acts, layer, p[0], g[0])?;
        }
        engine.end_backward(unit)?;
        engine.release(unit)?;
    }
    {
        let (_, mut g) = engine.views(&[], &[0])?;
        model.embed_backward(acts, g[0])?;
    }
    engine.end_backward(0)?;
    engine.release(0)?;
    Ok(())
}

/// Activation checkpointing: runs forward again the blocks of `last`'s segment, each
/// gathered in turn, and leaves `last` (the segment's last block, due for backward) gathered.
fn recompute_segment(
    engine: &mut Engine,
    model: &Gpt,
    acts: &mut Activations,
    last: usize,
) -> Result<(), StepError> {
    for layer in acts.segment(last) {
        let unit = ParamLayout::block_unit(layer);
        engine.gather(unit)?;
        model.block_recompute(acts, layer, engine.params(unit)?)?;
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
pub fn micro_step(
    engine: &mut Engine,
    model: &Gpt,
    acts: &mut Activations,
    tokens: &[u32],
    targets: &[u32],
) -> Result<f32, StepError> {
    let loss = forward(engine, model, acts, tokens, Some(targets))?.unwrap_or(f32::NAN);
    backward(engine, model, acts)?;
    engine.end_micro_step();
    Ok(loss)
}

/// The mean loss on one batch, forward only (evaluation).
///
/// # Errors
/// As [`micro_step`].
pub fn eval_loss(
    engine: &mut Engine,
    model: &Gpt,
    acts: &mut Activations,
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
pub fn with_logits<R>(
    engine: &mut Engine,
    model: &Gpt,
    acts: &mut Activations,
    tokens: &[u32],
    f: impl FnOnce(&[f32]) -> R,
) -> Result<R, StepError> {
    engine.without_order_check(|engine| {
        forward(engine, model, acts, tokens, None)?;
        let out = f(model.logits(acts)?);
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
