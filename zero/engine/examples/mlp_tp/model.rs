//! The residual MLP of `examples/mlp` split Megatron-style across a tensor-parallel group of T
//! ranks, beside ZeRO over the data-parallel group (`zero::tensor_parallel`).
//!
//! Block l, `h' = h + W2 relu(W1 h + b1) + b2`: W1 and b1 are column-parallel (each rank
//! holds H/T rows of W1 and of b1), W2 row-parallel (each rank holds its H/T columns), so a
//! rank computes a partial `W2_r relu(W1_r h + b1_r)` and the operation `BlockReduce` sums
//! the partials over the group (Megatron's `g`) and adds b2 after the reduction. In backward,
//! `CopyToTpBackward` sums the input's gradient over the group (Megatron's `f`). The input
//! projection, b2 and the classifier are replicated: every rank of the group holds and
//! updates the same values. Units: the input projection (0), then per block its slice
//! ([W1_r, b1_r, W2_r], `tp_sharded`) and its b2, then the classifier. Every tensor is made
//! whole by the un-split model's `init` and sliced, so every T starts from the same model.
//! No checkpointing here.

use crate::mlp::{affine, affine_backward_input, affine_backward_params, init, Shape};
use zero::tensor_parallel::{copy_to_tp, reduce_from_tp};
use zero::{Error, Model, Op, OpUnits, Program, UnitSpec};
use zero_comm::Communicator;

/// One operation of the split MLP's passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TpOp {
    Input,
    /// Block l's partial output from this rank's slice.
    Block(usize),
    /// Megatron's `g` forward: the partials summed over the group, then b2 and the residual.
    BlockReduce(usize),
    Head,
    HeadBackward,
    /// b2's gradient (the identity of `g` backward).
    BlockReduceBackward(usize),
    /// The slice's gradients and this rank's part of the input's gradient.
    BlockBackward(usize),
    /// Megatron's `f` backward: the input's gradient summed over the group.
    CopyToTpBackward(usize),
    InputBackward,
}

/// The split's shape: the network's, T, and this rank's place in the group.
#[derive(Debug, Clone, Copy)]
pub struct TpShape {
    pub net: Shape,
    pub tp: usize,
    pub tp_rank: usize,
}

impl TpShape {
    /// H/T, the slice's width; `None` when T does not divide H.
    pub fn width(&self) -> Option<usize> {
        (self.tp > 0 && self.net.hidden % self.tp == 0).then(|| self.net.hidden / self.tp)
    }

    fn slice_unit(&self, l: usize) -> usize {
        1 + 2 * l
    }

    fn bias_unit(&self, l: usize) -> usize {
        2 + 2 * l
    }

    fn head_unit(&self) -> usize {
        1 + 2 * self.net.blocks
    }

    /// The engine's view of the units.
    pub fn units(&self) -> Vec<UnitSpec> {
        let (d, h, c, w) = (
            self.net.inputs,
            self.net.hidden,
            self.net.classes,
            self.width_or_0(),
        );
        let mut units = vec![UnitSpec::new("input", h * d + h).with_decay(0..h * d)];
        for l in 0..self.net.blocks {
            let slice = UnitSpec::new(format!("block {l} slice"), 2 * w * h + w)
                .with_decay(0..w * h)
                .with_decay(w * h + w..2 * w * h + w)
                .tp_sharded();
            units.push(slice);
            units.push(UnitSpec::new(format!("block {l} b2"), h));
        }
        units.push(UnitSpec::new("head", c * h + c).with_decay(0..c * h));
        units
    }

    fn width_or_0(&self) -> usize {
        self.width().unwrap_or(0)
    }

    /// Unit `unit` of this rank: the un-split model's tensors, made whole and sliced.
    pub fn init(&self, unit: usize, w: &mut [f32]) {
        let (h, blocks) = (self.net.hidden, self.net.blocks);
        let whole = |u: usize| {
            let len = if u == 0 {
                h * self.net.inputs + h
            } else if u <= blocks {
                2 * h * h + 2 * h
            } else {
                self.net.classes * h + self.net.classes
            };
            let mut v = vec![0.0; len];
            init(&self.net, u, &mut v);
            v
        };
        if unit == 0 || unit == self.head_unit() {
            let whole_unit = if unit == 0 { 0 } else { blocks + 1 };
            w.copy_from_slice(&whole(whole_unit));
            return;
        }
        let l = (unit - 1) / 2;
        let block = whole(1 + l); // [W1 (H,H), b1 (H), W2 (H,H), b2 (H)]
        if unit == self.bias_unit(l) {
            w.copy_from_slice(&block[2 * h * h + h..]);
            return;
        }
        let (wd, rows) = (self.width_or_0(), self.tp_rank * self.width_or_0());
        let w1 = &block[rows * h..(rows + wd) * h];
        let b1 = &block[h * h + rows..h * h + rows + wd];
        let w2 = (0..h).flat_map(|o| {
            let at = h * h + h + o * h + rows;
            block[at..at + wd].iter().copied()
        });
        let slice: Vec<f32> = w1.iter().chain(b1).copied().chain(w2).collect();
        w.copy_from_slice(&slice);
    }

    /// The training program.
    pub fn train_program(&self) -> Program<TpOp> {
        let mut ops = self.forward_ops();
        ops.push(TpOp::HeadBackward);
        for l in (0..self.net.blocks).rev() {
            ops.extend([
                TpOp::BlockReduceBackward(l),
                TpOp::BlockBackward(l),
                TpOp::CopyToTpBackward(l),
            ]);
        }
        ops.push(TpOp::InputBackward);
        self.program(ops)
    }

    fn forward_ops(&self) -> Vec<TpOp> {
        let mut ops = vec![TpOp::Input];
        for l in 0..self.net.blocks {
            ops.extend([TpOp::Block(l), TpOp::BlockReduce(l)]);
        }
        ops.push(TpOp::Head);
        ops
    }

    fn program(&self, ops: Vec<TpOp>) -> Program<TpOp> {
        let (head, n) = (self.head_unit(), self.head_unit() + 1);
        let ops = ops.into_iter().map(|op| match op {
            TpOp::Input => Op::new(op).reads([0]),
            TpOp::Block(l) => Op::new(op).reads([self.slice_unit(l)]),
            TpOp::BlockReduce(l) => Op::new(op).reads([self.bias_unit(l)]),
            TpOp::Head => Op::new(op).reads([head]),
            TpOp::HeadBackward => Op::new(op).reads([head]).writes([head]),
            TpOp::BlockReduceBackward(l) => Op::new(op).writes([self.bias_unit(l)]),
            TpOp::BlockBackward(l) => {
                let u = self.slice_unit(l);
                Op::new(op).reads([u]).writes([u])
            }
            TpOp::CopyToTpBackward(_) => Op::new(op),
            TpOp::InputBackward => Op::new(op).writes([0]),
        });
        Program::new(ops.collect(), n).expect("units in range by construction")
    }
}

/// The split MLP on one rank's micro-batch: its tensor-parallel group, inputs, activations
/// and loss.
pub struct TpMlp {
    pub shape: TpShape,
    tp: Communicator,
    x: Vec<f32>,
    labels: Vec<usize>,
    /// Block inputs h_0..h_L (B, H), replicated over the group.
    h: Vec<Vec<f32>>,
    /// This rank's pre-activations a_l (B, H/T).
    a: Vec<Vec<f32>>,
    /// The partial output of the block being reduced, then the input gradient's part.
    partial: Vec<f32>,
    /// d(loss)/d(h) as backward goes (B, H), and the output gradient of the block (dy).
    dh: Vec<f32>,
    dy: Vec<f32>,
    probs: Vec<f32>,
    pub loss: f32,
}

impl TpMlp {
    /// A model of `shape` whose tensor-parallel group is `tp`.
    pub fn new(shape: TpShape, tp: Communicator) -> Self {
        let n = shape.net.blocks + 1;
        Self {
            shape,
            tp,
            x: vec![],
            labels: vec![],
            h: vec![vec![]; n],
            a: vec![vec![]; n],
            partial: vec![],
            dh: vec![],
            dy: vec![],
            probs: vec![],
            loss: f32::NAN,
        }
    }

    /// A new micro-batch (the same on every rank of the group).
    pub fn set_batch(&mut self, x: Vec<f32>, labels: Vec<usize>) {
        (self.x, self.labels) = (x, labels);
    }

    fn dims(&self) -> (usize, usize, usize, usize, usize) {
        let n = &self.shape.net;
        (
            n.batch,
            n.inputs,
            n.hidden,
            n.classes,
            self.shape.width_or_0(),
        )
    }

    /// Block l's partial output from this rank's slice (no bias, no residual).
    fn block(&mut self, l: usize, p: &[f32]) {
        let (b, _, h, _, w) = self.dims();
        let (w1, rest) = p.split_at(w * h);
        let (b1, w2) = rest.split_at(w);
        let a = affine(&self.h[l], w1, b1, b, h, w);
        let r: Vec<f32> = a.iter().map(|&v| v.max(0.0)).collect();
        self.partial = affine(&r, w2, &vec![0.0; h], b, w, h);
        self.a[l] = a;
    }

    /// `g` forward: the partials summed over the group, then b2 and the residual.
    fn block_reduce(&mut self, l: usize, b2: &[f32]) -> Result<(), Error> {
        reduce_from_tp::forward(&self.tp, &mut self.partial)?;
        let h = self.shape.net.hidden;
        let next = self.h[l].iter().zip(&self.partial).enumerate();
        self.h[l + 1] = next.map(|(i, (x, y))| x + (y + b2[i % h])).collect();
        Ok(())
    }

    fn head(&mut self, p: &[f32]) {
        let (b, _, h, c, _) = self.dims();
        let (w, bias) = p.split_at(c * h);
        let logits = affine(&self.h[self.shape.net.blocks], w, bias, b, h, c);
        self.probs = vec![0.0; b * c];
        let mut loss = 0.0f32;
        let rows = logits.chunks_exact(c).zip(self.probs.chunks_exact_mut(c));
        for ((row, probs), &label) in rows.zip(&self.labels) {
            let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
            let sum: f32 = row.iter().map(|&v| (v - max).exp()).sum();
            for (p, &v) in probs.iter_mut().zip(row) {
                *p = (v - max).exp() / sum;
            }
            loss -= probs[label].ln();
        }
        self.loss = loss / b as f32;
    }

    fn head_backward(&mut self, p: &[f32], g: &mut [f32]) {
        let (b, _, h, c, _) = self.dims();
        let mut dlogits = self.probs.clone();
        for i in 0..b {
            dlogits[i * c + self.labels[i]] -= 1.0;
        }
        dlogits.iter_mut().for_each(|v| *v /= b as f32);
        let (dw, db) = g.split_at_mut(c * h);
        affine_backward_params(&dlogits, &self.h[self.shape.net.blocks], dw, db, b, h, c);
        self.dh = affine_backward_input(&dlogits, &p[..c * h], b, h, c);
    }

    /// `g` backward (the identity) and b2's gradient.
    fn block_reduce_backward(&mut self, g: &mut [f32]) -> Result<(), Error> {
        self.dy = self.dh.clone();
        reduce_from_tp::backward(&self.tp, &mut self.dy)?;
        let h = self.shape.net.hidden;
        for row in self.dy.chunks_exact(h) {
            g.iter_mut().zip(row).for_each(|(g, d)| *g += d);
        }
        Ok(())
    }

    /// The slice's gradients, and this rank's part of the input's gradient.
    fn block_backward(&mut self, l: usize, p: &[f32], g: &mut [f32]) {
        let (b, _, h, _, w) = self.dims();
        let (w1, rest) = p.split_at(w * h);
        let w2 = &rest[w..];
        let (dw1, rest) = g.split_at_mut(w * h);
        let (db1, dw2) = rest.split_at_mut(w);
        let a = &self.a[l];
        let r: Vec<f32> = a.iter().map(|&v| v.max(0.0)).collect();
        affine_backward_params(&self.dy, &r, dw2, &mut vec![0.0; h], b, w, h);
        let mut da = affine_backward_input(&self.dy, w2, b, w, h);
        da.iter_mut()
            .zip(a)
            .for_each(|(d, &a)| *d = if a > 0.0 { *d } else { 0.0 });
        affine_backward_params(&da, &self.h[l], dw1, db1, b, h, w);
        self.partial = affine_backward_input(&da, w1, b, h, w);
    }

    /// `f` backward: the input's gradient summed over the group, plus the residual's.
    fn copy_to_tp_backward(&mut self) -> Result<(), Error> {
        copy_to_tp::backward(&self.tp, &mut self.partial)?;
        self.dh
            .iter_mut()
            .zip(&self.partial)
            .for_each(|(d, x)| *d += x);
        Ok(())
    }
}

impl Model for TpMlp {
    type Op = TpOp;
    type Error = Error;

    fn run(&mut self, op: &TpOp, units: &mut OpUnits<'_>) -> Result<(), Error> {
        let (b, d, h, _, _) = self.dims();
        let (p, mut g) = units.views()?;
        match *op {
            TpOp::Input => self.h[0] = affine(&self.x, &p[0][..h * d], &p[0][h * d..], b, d, h),
            TpOp::Block(l) => self.block(l, p[0]),
            TpOp::BlockReduce(l) => self.block_reduce(l, p[0])?,
            TpOp::Head => self.head(p[0]),
            TpOp::HeadBackward => self.head_backward(p[0], g[0]),
            TpOp::BlockReduceBackward(_) => self.block_reduce_backward(g[0])?,
            TpOp::BlockBackward(l) => self.block_backward(l, p[0], g[0]),
            TpOp::CopyToTpBackward(_) => self.copy_to_tp_backward()?,
            TpOp::InputBackward => {
                let (dw, db) = g[0].split_at_mut(h * d);
                affine_backward_params(&self.dh, &self.x, dw, db, b, d, h);
            }
        }
        Ok(())
    }
}
