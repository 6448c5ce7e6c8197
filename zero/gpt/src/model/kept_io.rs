//! Checkpointed segment inputs kept by the caller ([`KeptBy::Caller`]): taken after the
//! segment's first block runs forward, handed back before that block's recompute.

use super::Gpt;
use crate::activations::{check_kept_call, Activations, Kept, KeptBy, Progress};
use crate::backend::{Backend, View};
use crate::error::{GptError, Result};
use crate::layout::ParamLayout;
use crate::views::{sub, sub_mut};

impl<B: Backend> Gpt<B> {
    /// Copies the input (N,C) of block `layer`, the first block of a recomputed segment,
    /// into `into`, right after [`Gpt::block_forward`] of that block (or, split,
    /// [`Gpt::tp_block_output`]): what
    /// [`Gpt::restore_input`] hands back before the segment's recompute.
    ///
    /// # Errors
    /// Activations that keep their inputs themselves, a block that does not start a
    /// recomputed segment, a call out of order, an `into` that is not N*C floats.
    pub fn keep_input(
        &self,
        acts: &Activations<B>,
        layer: usize,
        into: &mut B::Slice,
    ) -> Result<()> {
        // Split blocks too: after Gpt::tp_block_output, progress is the same.
        self.check_layer(layer)?;
        let unit = ParamLayout::block_unit(layer);
        self.check_call_order(acts, Progress::Forward { next: unit + 1 }, "keep_input")?;
        check_caller_keeps(acts, layer, into.len())?;
        let nc = acts.b * acts.t * acts.c;
        self.backend.copy(into, sub(acts.fwd.floats(), 0..nc));
        Ok(())
    }

    /// Writes `from`, what [`Gpt::keep_input`] took for block `layer`'s segment, back into
    /// that block's input, before [`Gpt::block_recompute`] of `layer` (or, split, its
    /// recompute by [`Gpt::tp_attention_forward`]), which requires it.
    ///
    /// # Errors
    /// As [`Gpt::keep_input`]; a segment that is not due for its recompute.
    pub fn restore_input(
        &self,
        acts: &mut Activations<B>,
        layer: usize,
        from: &B::Slice,
    ) -> Result<()> {
        self.check_layer(layer)?;
        let due = ParamLayout::block_unit(acts.segment(layer).end - 1);
        self.check_call_order(acts, Progress::Backward { next: due }, "restore_input")?;
        let segment = check_caller_keeps(acts, layer, from.len())?;
        if !acts.needs_recompute(layer) {
            return Err(GptError::OutOfOrder {
                call: "restore_input",
                reason: format!("block {layer}'s segment holds its activations already"),
            });
        }
        let nc = acts.b * acts.t * acts.c;
        self.backend
            .copy(sub_mut(acts.fwd.floats_mut(), 0..nc), from);
        if let Kept::Caller { restored, .. } = &mut acts.kept {
            *restored = Some(segment);
        }
        Ok(())
    }
}

/// The segment of `layer` when the caller keeps the inputs, `layer` starts a recomputed
/// segment and `len` is one input's length.
fn check_caller_keeps<B: Backend>(
    acts: &Activations<B>,
    layer: usize,
    len: usize,
) -> Result<usize> {
    if !matches!(acts.kept, Kept::Caller { .. }) {
        return Err(GptError::KeptInputs {
            segment: 0,
            reason: format!("the activations keep their inputs ({:?})", KeptBy::Model),
        });
    }
    let segment = acts.segment_index(layer);
    if acts.segment(layer).start != layer {
        return Err(GptError::KeptInputs {
            segment,
            reason: format!("block {layer} does not start its segment"),
        });
    }
    check_kept_call(acts.kept.shape(), segment, len)?;
    Ok(segment)
}

#[cfg(test)]
mod tests {
    use crate::{init_params, train_ops, Activations, Gpt, GptConfig, GptOp, KeptBy, ParamLayout};
    use std::collections::HashMap;

    const EVERY: Option<usize> = Some(2);

    fn tokens(n: usize, seed: u32) -> Vec<u32> {
        (0..n as u32).map(|i| (i * 7 + seed) % 32).collect()
    }

    /// One micro-step over zero-gpt's program, the kept inputs in `store` (a caller's).
    fn caller_kept_step(
        model: &Gpt,
        params: &[Vec<f32>],
        grads: &mut [Vec<f32>],
        store: &mut HashMap<usize, Vec<f32>>,
    ) -> crate::Result<f32> {
        let cfg = *model.config();
        let mut acts = Activations::with_backend_memory(
            &crate::CpuBackend,
            &cfg,
            2,
            4,
            EVERY,
            |_, len| Ok::<_, crate::GptError>(Box::new(vec![0f32; len]) as crate::Buffer),
            KeptBy::Caller,
        )?;
        let (x, y) = (tokens(8, 1), tokens(8, 2));
        let (layers, last) = (cfg.num_layers, model.layout().final_norm_unit());
        let mut loss = f32::NAN;
        let unit = ParamLayout::block_unit;
        for op in train_ops(layers, EVERY) {
            if let Some(k) = op.restores(layers, EVERY) {
                let GptOp::Recompute(l) = op else {
                    unreachable!()
                };
                model.restore_input(&mut acts, l, &store[&k])?;
            }
            match op {
                GptOp::Embed => model.embed_forward(&mut acts, &params[0], &x)?,
                GptOp::Block(l) => model.block_forward(&mut acts, l, &params[unit(l)])?,
                GptOp::Recompute(l) => model.block_recompute(&mut acts, l, &params[unit(l)])?,
                GptOp::Head => {
                    let head = model.head_forward(&mut acts, &params[last], &params[0], Some(&y));
                    loss = head?.unwrap_or(f32::NAN);
                }
                GptOp::HeadBackwardInput => {
                    let g = &mut grads[last];
                    model.head_backward_input(&mut acts, &params[last], &params[0], g)?;
                }
                GptOp::HeadBackwardWeight => {
                    model.head_backward_weight(&mut acts, &mut grads[0])?
                }
                GptOp::BlockBackward(l) => {
                    model.block_backward(&mut acts, l, &params[unit(l)], &mut grads[unit(l)])?;
                }
                GptOp::EmbedBackward => model.embed_backward(&mut acts, &mut grads[0])?,
            }
            if let (Some(k), GptOp::Block(l)) = (op.keeps(layers, EVERY), op) {
                let mut kept = vec![0f32; 8 * cfg.channels];
                model.keep_input(&acts, l, &mut kept)?;
                store.insert(k, kept);
            }
        }
        Ok(loss)
    }

    #[test]
    fn inputs_kept_by_the_caller_give_the_bits_of_inputs_kept_by_the_activations() {
        let cfg = GptConfig::new(4, 32, 5, 2, 16).unwrap();
        let model = Gpt::new(cfg).unwrap();
        let params = init_params(&cfg, model.layout(), 7);
        let zeros = || {
            params
                .iter()
                .map(|p| vec![0f32; p.len()])
                .collect::<Vec<_>>()
        };
        let mut acts = Activations::with_checkpointing(&cfg, 2, 4, EVERY).unwrap();
        let mut want = zeros();
        let (x, y) = (tokens(8, 1), tokens(8, 2));
        let loss = model.forward_backward(&mut acts, &params, &mut want, &x, &y);
        let mut got = zeros();
        let mut store = HashMap::new();
        let caller = caller_kept_step(&model, &params, &mut got, &mut store).unwrap();
        assert_eq!(caller.to_bits(), loss.unwrap().to_bits());
        assert_eq!(
            store.len(),
            2,
            "segments 0..2 and 2..4 are kept, 4..5 is not"
        );
        for (u, (g, w)) in got.iter().zip(&want).enumerate() {
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(g), bits(w), "unit {u}");
        }
    }

    #[test]
    fn a_recompute_without_its_input_handed_back_is_refused() {
        let cfg = GptConfig::new(4, 32, 4, 2, 16).unwrap();
        let model = Gpt::new(cfg).unwrap();
        let params = init_params(&cfg, model.layout(), 7);
        let alloc = |_, len| Ok::<_, crate::GptError>(Box::new(vec![0f32; len]) as crate::Buffer);
        let mut acts = Activations::with_backend_memory(
            &crate::CpuBackend,
            &cfg,
            2,
            4,
            EVERY,
            alloc,
            KeptBy::Caller,
        )
        .unwrap();
        let mut grads: Vec<Vec<f32>> = params.iter().map(|p| vec![0f32; p.len()]).collect();
        let err =
            model.forward_backward(&mut acts, &params, &mut grads, &tokens(8, 1), &tokens(8, 2));
        assert!(
            matches!(err, Err(crate::GptError::KeptInputs { segment: 0, .. })),
            "{err:?}"
        );
    }
}
