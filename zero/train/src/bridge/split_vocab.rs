//! The calls of a tensor-parallel rank whose vocabulary is split too
//! ([`Gpt::with_vocab_parallel`], Megatron's vocab-parallel embedding and cross-entropy, the
//! tied head included): each rank holds rows `rank*W..(rank+1)*W` of `wte` (W = Vp / T), and
//! the group sums the embedding, the loss statistics and d(lnf) (three [`TpOp::AllReduce`]s
//! of the program, run by [`TpPass`](super::split::TpPass) as the blocks' are). The logits
//! are never gathered for the loss; the closing sample gathers one position's
//! ([`gather_logits_row`]). zero-gpt runs these calls on the CPU only.

use super::StepError;
use zero::OpUnits;
use zero_comm::Communicator;
use zero_gpt::{Activations, Gpt, GptError, TpOp};

/// Runs `op`, one of the vocabulary split's calls, on the units the engine hands it; returns
/// the mean loss after [`TpOp::HeadLoss`]. Without `targets` (the sampler's pass) the head
/// is given token 0 as every target: the statistics it computes then are never read.
///
/// # Errors
/// Model and engine errors; an op that is not one of the vocabulary split's.
pub(super) fn run_vocab_op(
    model: &Gpt,
    acts: &mut Activations,
    op: TpOp,
    units: &mut OpUnits<'_>,
    tokens: &[u32],
    targets: Option<&[u32]>,
) -> Result<Option<f32>, StepError> {
    let (p, mut g) = units.views()?;
    match (op, g.as_mut_slice()) {
        (TpOp::EmbedSlice, []) => model.tp_embed_forward(acts, p[0], p[1], tokens)?,
        (TpOp::HeadSlice, []) => {
            let none;
            let targets = match targets {
                Some(targets) => targets,
                None => {
                    none = vec![0u32; acts.batch() * acts.seq_len()];
                    &none
                }
            };
            model.tp_head_forward(acts, p[0], p[1], targets)?;
        }
        (TpOp::HeadLoss, []) => return Ok(Some(model.tp_head_loss(acts)?)),
        (TpOp::HeadSliceBackwardInput, []) => model.tp_head_backward_input(acts, p[0])?,
        (TpOp::HeadSliceBackwardRest, [final_grad, wte_grad]) => {
            model.tp_head_backward_rest(acts, p[0], final_grad, wte_grad)?;
        }
        (TpOp::EmbedSliceBackward, [wte_grad, wpe_grad]) => {
            model.tp_embed_backward(acts, wte_grad, wpe_grad)?;
        }
        _ => {
            return Err(GptError::OutOfOrder {
                call: "run_vocab_op",
                reason: format!("{op:?} is not a call of the vocabulary split"),
            }
            .into())
        }
    }
    Ok(None)
}

/// Position `pos`'s logits over the whole padded vocabulary (Vp floats), gathered over the
/// group `tp` from each rank's (N,W) slice ([`Gpt::tp_logits`]) after a pass that ran the
/// head's forward: rank r's W ids follow rank r-1's, so the gather's rank order is the
/// vocabulary's.
///
/// # Errors
/// No head forward just before; a position past the pass; collective failures.
pub(super) fn gather_logits_row(
    model: &Gpt,
    acts: &Activations,
    tp: &Communicator,
    pos: usize,
) -> Result<Vec<f32>, StepError> {
    let logits = model.tp_logits(acts)?;
    let width = model.config().padded_vocab_size / tp.size();
    let row = logits
        .get(pos * width..(pos + 1) * width)
        .ok_or_else(|| GptError::OutOfOrder {
            call: "gather_logits_row",
            reason: format!(
                "position {pos} is past the pass's {} positions",
                logits.len() / width
            ),
        })?;
    let mut whole = vec![0f32; width * tp.size()];
    tp.all_gather(row, &mut whole).map_err(zero::Error::from)?;
    Ok(whole)
}
