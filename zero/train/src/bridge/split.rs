//! The GPT split over a tensor-parallel group (Megatron's way, zero-gpt's
//! [`Gpt::with_tensor_parallel`]) driven through the ZeRO engine on the data-parallel group:
//! its passes declared as programs of zero-gpt's split calls ([`zero_gpt::tp_train_ops`]),
//! the group's sums among them as operations of their own ([`TpOp::AllReduce`]), which
//! [`TpPass`] runs on the tensor-parallel communicator the engine was told
//! ([`zero::OpUnits::tensor_parallel`]), in place on the buffer [`Gpt::tp_partial`] hands
//! out.
//!
//! With the vocabulary split too ([`Gpt::with_vocab_parallel`], the trainer's layout), the
//! embedding and the tied head run as `super::split_vocab`'s calls on each rank's rows of
//! `wte`; without it they stay whole on every rank of the group. The final LayerNorm, the
//! position embedding and each block's replicated unit are computed alike on every rank, so
//! their gradients are the same on every rank of the group; the block slices and the rows of
//! `wte` differ ([`UnitSpec::tp_sharded`](zero::UnitSpec)).
//!
//! Legend: L layers, T the tensor-parallel size.

use super::split_vocab::run_vocab_op;
use super::{Placement, StepError};
use zero::{Engine, Model, Op, OpUnits, Program, Schedule};
use zero_gpt::{tp_train_ops, Activations, BlockPart, Gpt, GptError, ParamLayout, TpOp};

/// The programs of a rank of a tensor-parallel group whose layout is `layout`
/// ([`ParamLayout::split`], or [`ParamLayout::split_vocab`] with the vocabulary split),
/// checkpointing every `every` blocks or none: its training micro-step, its forward pass
/// to the loss (evaluation) and to the logits (sampling).
#[derive(Debug, Clone)]
pub struct TpPrograms {
    /// One training micro-step.
    pub train: Program<TpOp>,
    /// One forward pass to the loss, no gradients.
    pub forward: Program<TpOp>,
    /// One forward pass to the logits (with the vocabulary split, each rank's slice).
    pub logits: Program<TpOp>,
}

impl TpPrograms {
    /// The programs of `layout` with checkpointing every `every` blocks or none.
    ///
    /// # Errors
    /// A layout whose units do not match its layers (a broken invariant).
    pub fn new(layout: &ParamLayout, every: Option<usize>) -> Result<Self, zero::Error> {
        let (layers, vocab) = (layout.num_layers(), layout.vocab_parallel());
        // A forward pass keeps nothing: nothing is recomputed after it.
        let forward = |last| tp_program(layout, tp_forward_ops(layers, vocab, last), None);
        Ok(Self {
            train: tp_program(layout, tp_train_ops(layers, every, vocab), every)?,
            forward: forward(if vocab { TpOp::HeadLoss } else { TpOp::Head })?,
            logits: forward(if vocab { TpOp::HeadSlice } else { TpOp::Head })?,
        })
    }

    /// Every program's calls, as the engine is told them at start-up.
    pub fn schedules(&self) -> [&Schedule; 3] {
        [
            self.train.schedule(),
            self.forward.schedule(),
            self.logits.schedule(),
        ]
    }
}

/// A forward pass of a split model of `layers` layers (its vocabulary split too, with
/// `vocab`): the training micro-step's ops up to `last`, without checkpointing.
#[must_use]
pub fn tp_forward_ops(layers: usize, vocab: bool, last: TpOp) -> Vec<TpOp> {
    let mut ops = tp_train_ops(layers, None, vocab);
    let end = ops.iter().position(|op| *op == last);
    ops.truncate(end.map_or(ops.len(), |h| h + 1));
    ops
}

/// The program of `ops` on a rank laid out as `layout`, checkpointing every `every` blocks or
/// none: each op with the units it reads and writes ([`TpOp::reads`], [`TpOp::writes`]) and
/// the segment input it keeps or restores.
///
/// # Errors
/// A call naming a unit the layout does not have; kept inputs out of order.
pub fn tp_program(
    layout: &ParamLayout,
    ops: Vec<TpOp>,
    every: Option<usize>,
) -> Result<Program<TpOp>, zero::Error> {
    let layers = layout.num_layers();
    let ops = ops
        .into_iter()
        .map(|op| {
            let mut declared = Op::new(op)
                .reads(op.reads(layout))
                .writes(op.writes(layout));
            declared.keeps = op.keeps(layers, every);
            declared.restores = op.restores(layers, every);
            declared
        })
        .collect();
    Program::new(ops, layout.units().len()).map_err(zero::Error::BadProgram)
}

/// One pass of a split GPT on one batch, as the engine runs it: each [`TpOp`] is the model
/// call of the same name on the units the engine hands it, or the group's sum.
pub(super) struct TpPass<'m, B: Placement> {
    pub(super) model: &'m Gpt<B>,
    pub(super) acts: &'m mut Activations<B>,
    pub(super) tokens: &'m [u32],
    pub(super) targets: Option<&'m [u32]>,
    /// The head's mean loss (with targets).
    pub(super) loss: Option<f32>,
}

impl<B: Placement> TpPass<'_, B> {
    /// A part of block `layer`'s forward (or recompute): the kept input restored before a
    /// recomputed segment's first block, kept after a checkpointed segment's first block.
    fn block_part(
        &mut self,
        layer: usize,
        part: BlockPart,
        units: &mut OpUnits<'_>,
    ) -> Result<(), StepError> {
        let (model, acts) = (self.model, &mut *self.acts);
        match part {
            BlockPart::Attention => {
                if units.restores().is_some() {
                    model.restore_input(acts, layer, B::restored(units)?)?;
                }
                let [slice, replicated] = op_params::<B>(units, TpOp::Block(layer, part))?;
                model.tp_attention_forward(acts, layer, slice, replicated)?;
            }
            BlockPart::Mlp => {
                let [slice, replicated] = op_params::<B>(units, TpOp::Block(layer, part))?;
                model.tp_mlp_forward(acts, layer, slice, replicated)?;
            }
            BlockPart::Output => {
                model.tp_block_output(acts, layer)?;
                if units.keeps().is_some() {
                    model.keep_input(acts, layer, B::kept_mut(units)?)?;
                }
            }
        }
        Ok(())
    }

    /// A backward call of block `layer`: `op` is [`TpOp::MlpBackward`],
    /// [`TpOp::AttentionBackward`] or [`TpOp::BlockInputGrad`].
    fn block_backward(&mut self, op: TpOp, units: &mut OpUnits<'_>) -> Result<(), StepError> {
        let (model, acts) = (self.model, &mut *self.acts);
        let (p, mut g) = B::views(units)?;
        match (op, g.as_mut_slice()) {
            (TpOp::MlpBackward(l), [slice, replicated]) => {
                model.tp_mlp_backward(acts, l, [p[0], p[1]], slice, replicated)?;
            }
            (TpOp::AttentionBackward(l), [slice, replicated]) => {
                model.tp_attention_backward(acts, l, [p[0], p[1]], slice, replicated)?;
            }
            (TpOp::BlockInputGrad(l), [replicated]) => {
                model.tp_block_input_grad(acts, l, p[0], replicated)?;
            }
            _ => return Err(unsupported(op).into()),
        }
        Ok(())
    }
}

impl<B: Placement> Model for TpPass<'_, B> {
    type Op = TpOp;
    type Error = StepError;

    fn run(&mut self, op: &TpOp, units: &mut OpUnits<'_>) -> Result<(), StepError> {
        let model = self.model;
        let last = model.layout().final_norm_unit();
        match *op {
            TpOp::Embed => model.embed_forward(self.acts, B::params(units, 0)?, self.tokens)?,
            TpOp::Block(l, part) | TpOp::Recompute(l, part) => self.block_part(l, part, units)?,
            TpOp::AllReduce => B::tp_all_reduce(units, model.tp_partial(self.acts)?)?,
            TpOp::Head => {
                let (wf, wte) = (B::params(units, last)?, B::params(units, 0)?);
                self.loss = model.head_forward(self.acts, wf, wte, self.targets)?;
            }
            TpOp::HeadBackward => {
                let (p, mut g) = B::views(units)?;
                let [final_grad, embed_grad] = g.as_mut_slice() else {
                    return Err(unsupported(*op).into());
                };
                model.head_backward(self.acts, p[0], p[1], final_grad, embed_grad)?;
            }
            TpOp::MlpBackward(_) | TpOp::AttentionBackward(_) | TpOp::BlockInputGrad(_) => {
                self.block_backward(*op, units)?;
            }
            TpOp::EmbedBackward => model.embed_backward(self.acts, B::views(units)?.1[0])?,
            TpOp::EmbedSlice
            | TpOp::HeadSlice
            | TpOp::HeadLoss
            | TpOp::HeadSliceBackwardInput
            | TpOp::HeadSliceBackwardRest
            | TpOp::EmbedSliceBackward => {
                let Some((model, acts)) = B::on_cpu(model, self.acts) else {
                    return Err(unsupported(*op).into());
                };
                let (tokens, targets) = (self.tokens, self.targets);
                if let Some(loss) = run_vocab_op(model, acts, *op, units, tokens, targets)? {
                    self.loss = Some(loss);
                }
            }
        }
        Ok(())
    }
}

/// A block forward call's parameters, (its slice, the block's replicated unit): the two
/// units `op` was declared to read, in order ([`TpOp::reads`], the one source of which
/// slice a call takes).
fn op_params<'u, B: Placement>(
    units: &'u mut OpUnits<'_>,
    op: TpOp,
) -> Result<[&'u B::Slice; 2], StepError> {
    match B::views(units)?.0.as_slice() {
        &[slice, replicated] => Ok([slice, replicated]),
        _ => Err(unsupported(op).into()),
    }
}

/// An op declared with other units than the bridge runs it on, or a vocabulary-split op on
/// a backend other than the CPU's: a broken invariant, refused.
fn unsupported(op: TpOp) -> GptError {
    GptError::OutOfOrder {
        call: "TpPass::run",
        reason: format!("{op:?} is not an operation of the trainer's split programs"),
    }
}

/// One training micro-step of a split model on this rank's (B, T) batch (the same batch on
/// every rank of its tensor-parallel group): forward and backward with the group's sums,
/// and the reductions of every unit's gradient over the data-parallel group. Returns the
/// mean loss (the same on every rank of the group).
///
/// # Errors
/// As [`micro_step`](super::micro_step); an engine told no tensor-parallel group.
pub fn tp_train_program<B: Placement>(
    engine: &mut Engine,
    program: &Program<TpOp>,
    model: &Gpt<B>,
    acts: &mut Activations<B>,
    tokens: &[u32],
    targets: &[u32],
) -> Result<f32, StepError> {
    let mut pass = TpPass {
        model,
        acts,
        tokens,
        targets: Some(targets),
        loss: None,
    };
    engine.micro_step(program, &mut pass)?;
    pass.loss.ok_or(StepError::NoLoss)
}
