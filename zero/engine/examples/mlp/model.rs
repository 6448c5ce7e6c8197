//! A residual MLP classifier driven by the ZeRO engine through [`zero::Model`]: the second
//! model that proves the engine is thin (the first is the bundled GPT).
//!
//! Shape: `h0 = W_in x + b_in`; block l: `a = W1 h + b1`, `h' = h + W2 relu(a) + b2`;
//! `logits = W_out h_L + b_out`; mean softmax cross-entropy over the batch. One unit per
//! layer: the input projection (unit 0), each block (units 1..=L), the classifier (L+1).
//! Activation checkpointing keeps each segment's input and runs the segment forward again
//! before its backward, as the GPT does; the last segment keeps its forward. Through the
//! engine, a segment's input is a kept input of the program ([`Op::keeps`],
//! [`Op::restores`]): the engine holds it, in its arena or offloaded to pinned host memory,
//! between the segment's forward and its recompute.

use std::ops::Range;
use zero::{Error, KeptInputs, Model, Op, OpUnits, Program, UnitSpec};

/// Sizes of the network and of one rank's batch.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// Input features (D).
    pub inputs: usize,
    /// Hidden width (H).
    pub hidden: usize,
    /// Classes (C).
    pub classes: usize,
    /// Residual blocks (L).
    pub blocks: usize,
    /// Examples per micro-batch on one rank (B).
    pub batch: usize,
}

/// One operation of the MLP's passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MlpOp {
    /// The input projection.
    Input,
    /// A block's forward.
    Block(usize),
    /// A block's forward again, from its kept segment input (checkpointing).
    Recompute(usize),
    /// Logits and the loss.
    Head,
    /// The classifier's backward.
    HeadBackward,
    /// A block's backward.
    BlockBackward(usize),
    /// The input projection's backward (reads no parameters).
    InputBackward,
}

impl Shape {
    /// Unit lengths: each a weight matrix (weight decay) then its bias, in that order.
    fn tensors(&self, unit: usize) -> Vec<(usize, bool)> {
        let (d, h, c) = (self.inputs, self.hidden, self.classes);
        match unit {
            0 => vec![(h * d, true), (h, false)],
            u if u <= self.blocks => vec![(h * h, true), (h, false), (h * h, true), (h, false)],
            _ => vec![(c * h, true), (c, false)],
        }
    }

    /// The engine's view of the units.
    pub fn units(&self) -> Vec<UnitSpec> {
        (0..self.blocks + 2)
            .map(|u| {
                let tensors = self.tensors(u);
                let numel = tensors.iter().map(|&(len, _)| len).sum();
                let mut spec = UnitSpec::new(format!("unit {u}"), numel);
                let mut at = 0;
                for (len, decay) in tensors {
                    if decay {
                        spec = spec.with_decay(at..at + len);
                    }
                    at += len;
                }
                spec
            })
            .collect()
    }

    /// The segment of block `l` when checkpointing every `every` blocks (or `l` alone).
    pub fn segment(&self, l: usize, every: Option<usize>) -> Range<usize> {
        match every {
            None => l..l + 1,
            Some(k) => (l - l % k)..(l - l % k + k).min(self.blocks),
        }
    }

    /// The kept inputs of this model (each a segment's input, (B, H)), offloaded or not.
    pub fn kept_inputs(&self, offload: bool) -> KeptInputs {
        KeptInputs {
            len: self.batch * self.hidden,
            offload,
            partitions: 1,
        }
    }

    /// The kept input block `l` keeps in forward and restores before its recompute: its
    /// segment's, when `l` starts a recomputed segment.
    fn kept_input(&self, l: usize, every: Option<usize>) -> Option<usize> {
        let starts = self.segment(l, every).start == l;
        (starts && self.recomputed(l, every)).then(|| l / every.unwrap_or(1))
    }

    /// Whether block `l`'s segment is recomputed in backward (all but the last segment).
    fn recomputed(&self, l: usize, every: Option<usize>) -> bool {
        every.is_some()
            && self.segment(l, every).start != self.segment(self.blocks - 1, every).start
    }

    /// The forward-only program: input, blocks, head.
    pub fn forward_program(&self) -> Program<MlpOp> {
        self.program(self.forward_ops(), None)
    }

    /// The training program, checkpointing every `every` blocks or none.
    pub fn train_program(&self, every: Option<usize>) -> Program<MlpOp> {
        let mut ops = self.forward_ops();
        ops.push(MlpOp::HeadBackward);
        for l in (0..self.blocks).rev() {
            let segment = self.segment(l, every);
            if l + 1 == segment.end && self.recomputed(l, every) {
                ops.extend(segment.map(MlpOp::Recompute));
            }
            ops.push(MlpOp::BlockBackward(l));
        }
        ops.push(MlpOp::InputBackward);
        self.program(ops, every)
    }

    fn forward_ops(&self) -> Vec<MlpOp> {
        let mut ops = vec![MlpOp::Input];
        ops.extend((0..self.blocks).map(MlpOp::Block));
        ops.push(MlpOp::Head);
        ops
    }

    fn program(&self, ops: Vec<MlpOp>, every: Option<usize>) -> Program<MlpOp> {
        let head = self.blocks + 1;
        let kept = |l| self.kept_input(l, every);
        let ops = ops.into_iter().map(|op| match op {
            MlpOp::Input => Op::new(op).reads([0]),
            MlpOp::Block(l) => {
                let op = Op::new(op).reads([l + 1]);
                match kept(l) {
                    Some(k) => op.keeps(k),
                    None => op,
                }
            }
            MlpOp::Recompute(l) => {
                let op = Op::new(op).reads([l + 1]);
                match kept(l) {
                    Some(k) => op.restores(k),
                    None => op,
                }
            }
            MlpOp::Head => Op::new(op).reads([head]),
            MlpOp::HeadBackward => Op::new(op).reads([head]).writes([head]),
            MlpOp::BlockBackward(l) => Op::new(op).reads([l + 1]).writes([l + 1]),
            MlpOp::InputBackward => Op::new(op).writes([0]),
        });
        Program::new(ops.collect(), self.blocks + 2).expect("units in range by construction")
    }
}

/// The MLP on one micro-batch: its inputs, activations and loss.
pub struct Mlp {
    pub shape: Shape,
    /// Checkpointing every K blocks, or none.
    pub every: Option<usize>,
    /// Inputs (B, D) and labels (B).
    pub x: Vec<f32>,
    pub labels: Vec<usize>,
    /// Block inputs h_0..h_L (B, H) each, `None` where checkpointing dropped them.
    h: Vec<Option<Vec<f32>>>,
    /// Block pre-activations a_l (B, H).
    a: Vec<Option<Vec<f32>>>,
    /// d(loss)/d(logits), then the residual stream's gradient (B, H).
    dh: Vec<f32>,
    /// Softmax probabilities (B, C).
    probs: Vec<f32>,
    /// The micro-batch's mean loss.
    pub loss: f32,
}

impl Mlp {
    /// A model of `shape` on micro-batch `(x, labels)`.
    pub fn new(shape: Shape, every: Option<usize>, x: Vec<f32>, labels: Vec<usize>) -> Self {
        let n = shape.blocks + 1;
        Self {
            shape,
            every,
            x,
            labels,
            h: vec![None; n],
            a: vec![None; n],
            dh: vec![],
            probs: vec![],
            loss: f32::NAN,
        }
    }

    /// A new micro-batch.
    pub fn set_batch(&mut self, x: Vec<f32>, labels: Vec<usize>) {
        (self.x, self.labels) = (x, labels);
    }

    /// Block `l`'s forward from h_l, storing a_l and h_{l+1}.
    fn block(&mut self, l: usize, p: &[f32]) -> Result<(), Error> {
        let (b, h) = (self.shape.batch, self.shape.hidden);
        let [w1, b1, w2, b2] = split4(p, h * h, h);
        let x = kept(&self.h[l])?;
        let a = affine(x, w1, b1, b, h, h);
        let r: Vec<f32> = a.iter().map(|&v| v.max(0.0)).collect();
        let y = affine(&r, w2, b2, b, h, h);
        let next = x.iter().zip(&y).map(|(x, y)| x + y).collect();
        self.h[l + 1] = Some(next);
        self.a[l] = Some(a);
        Ok(())
    }

    /// Drops what checkpointing does not keep after block `l`'s forward: blocks of every
    /// segment but the last keep only the segment's input.
    fn drop_after_forward(&mut self, l: usize) {
        if self.shape.recomputed(l, self.every) {
            self.a[l] = None;
            if self.shape.segment(l, self.every).start != l {
                self.h[l] = None;
            }
        }
    }

    fn head(&mut self, p: &[f32]) -> Result<(), Error> {
        let (b, h, c) = (self.shape.batch, self.shape.hidden, self.shape.classes);
        let (w, bias) = p.split_at(c * h);
        let logits = affine(kept(&self.h[self.shape.blocks])?, w, bias, b, h, c);
        let mut loss = 0.0f32;
        self.probs = vec![0.0; b * c];
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
        Ok(())
    }

    fn head_backward(&mut self, p: &[f32], g: &mut [f32]) -> Result<(), Error> {
        let (b, h, c) = (self.shape.batch, self.shape.hidden, self.shape.classes);
        let mut dlogits = self.probs.clone();
        for i in 0..b {
            dlogits[i * c + self.labels[i]] -= 1.0;
        }
        dlogits.iter_mut().for_each(|v| *v /= b as f32);
        let (dw, db) = g.split_at_mut(c * h);
        affine_backward_params(&dlogits, kept(&self.h[self.shape.blocks])?, dw, db, b, h, c);
        self.dh = affine_backward_input(&dlogits, &p[..c * h], b, h, c);
        Ok(())
    }

    fn block_backward(&mut self, l: usize, p: &[f32], g: &mut [f32]) -> Result<(), Error> {
        let (b, h) = (self.shape.batch, self.shape.hidden);
        let [w1, _, w2, _] = split4(p, h * h, h);
        let (dw1, rest) = g.split_at_mut(h * h);
        let (db1, rest) = rest.split_at_mut(h);
        let (dw2, db2) = rest.split_at_mut(h * h);
        let a = kept(&self.a[l])?;
        let r: Vec<f32> = a.iter().map(|&v| v.max(0.0)).collect();
        affine_backward_params(&self.dh, &r, dw2, db2, b, h, h);
        let mut da = affine_backward_input(&self.dh, w2, b, h, h);
        da.iter_mut()
            .zip(a)
            .for_each(|(d, &a)| *d = if a > 0.0 { *d } else { 0.0 });
        affine_backward_params(&da, kept(&self.h[l])?, dw1, db1, b, h, h);
        let dx = affine_backward_input(&da, w1, b, h, h);
        self.dh.iter_mut().zip(&dx).for_each(|(d, x)| *d += x);
        Ok(())
    }
}

impl Mlp {
    /// Runs `op` on the parameters it reads (`p`) and the gradients it writes (`g`), in the
    /// orders its program declares.
    fn apply(&mut self, op: MlpOp, p: &[&[f32]], g: &mut [&mut [f32]]) -> Result<(), Error> {
        let (b, d, h) = (self.shape.batch, self.shape.inputs, self.shape.hidden);
        match op {
            MlpOp::Input => {
                self.h[0] = Some(affine(&self.x, &p[0][..h * d], &p[0][h * d..], b, d, h))
            }
            MlpOp::Block(l) => {
                self.block(l, p[0])?;
                self.drop_after_forward(l);
            }
            MlpOp::Recompute(l) => self.block(l, p[0])?,
            MlpOp::Head => self.head(p[0])?,
            MlpOp::HeadBackward => self.head_backward(p[0], g[0])?,
            MlpOp::BlockBackward(l) => self.block_backward(l, p[0], g[0])?,
            MlpOp::InputBackward => {
                let (dw, db) = g[0].split_at_mut(h * d);
                affine_backward_params(&self.dh, &self.x, dw, db, b, d, h);
            }
        }
        Ok(())
    }

    /// One micro-step without an engine, on every unit's whole parameters, adding into
    /// whole gradients: what a reference for the engine computes with.
    ///
    /// # Errors
    /// None for a well-formed program (an activation missing otherwise).
    pub fn forward_backward(
        &mut self,
        params: &[Vec<f32>],
        grads: &mut [Vec<f32>],
    ) -> Result<(), Error> {
        for op in self.shape.train_program(self.every).ops() {
            let p: Vec<&[f32]> = op.reads.iter().map(|&u| params[u].as_slice()).collect();
            let mut g: Vec<&mut [f32]> = grads
                .iter_mut()
                .enumerate()
                .filter(|(u, _)| op.writes.contains(u))
                .map(|(_, g)| g.as_mut_slice())
                .collect();
            self.apply(op.kind, &p, &mut g)?;
        }
        Ok(())
    }
}

impl Model for Mlp {
    type Op = MlpOp;
    type Error = Error;

    fn run(&mut self, op: &MlpOp, units: &mut OpUnits<'_>) -> Result<(), Error> {
        if let (MlpOp::Recompute(l), Some(_)) = (*op, units.restores()) {
            self.h[l] = Some(units.restored()?.to_vec());
        }
        let (p, mut g) = units.views()?;
        self.apply(*op, &p, &mut g)?;
        if let (MlpOp::Block(l), Some(_)) = (*op, units.keeps()) {
            // The engine holds the segment's input until its recompute.
            let input = self.h[l].take();
            units.kept_mut()?.copy_from_slice(kept(&input)?);
        }
        Ok(())
    }
}

/// An activation the forward pass kept (or a recompute restored).
fn kept(v: &Option<Vec<f32>>) -> Result<&[f32], Error> {
    v.as_deref()
        .ok_or_else(|| Error::Order("an activation was dropped and not recomputed".into()))
}

/// `[W1 (n), b1 (m), W2 (n), b2 (m)]` of a block's parameters.
fn split4(p: &[f32], n: usize, m: usize) -> [&[f32]; 4] {
    let (w1, rest) = p.split_at(n);
    let (b1, rest) = rest.split_at(m);
    let (w2, b2) = rest.split_at(n);
    [w1, b1, w2, b2]
}

/// `y = x W^T + b` for x (rows, n_in), W (n_out, n_in): each output summed in input order.
pub fn affine(x: &[f32], w: &[f32], b: &[f32], rows: usize, n_in: usize, n_out: usize) -> Vec<f32> {
    let mut y = vec![0.0; rows * n_out];
    for r in 0..rows {
        for o in 0..n_out {
            let dot: f32 = (0..n_in).map(|i| x[r * n_in + i] * w[o * n_in + i]).sum();
            y[r * n_out + o] = dot + b[o];
        }
    }
    y
}

/// Adds `dW += dy^T x` and `db += Σ_rows dy` (rows in order).
pub fn affine_backward_params(
    dy: &[f32],
    x: &[f32],
    dw: &mut [f32],
    db: &mut [f32],
    rows: usize,
    n_in: usize,
    n_out: usize,
) {
    for r in 0..rows {
        for o in 0..n_out {
            let g = dy[r * n_out + o];
            db[o] += g;
            for i in 0..n_in {
                dw[o * n_in + i] += g * x[r * n_in + i];
            }
        }
    }
}

/// `dx = dy W`: each input's gradient summed in output order.
pub fn affine_backward_input(
    dy: &[f32],
    w: &[f32],
    rows: usize,
    n_in: usize,
    n_out: usize,
) -> Vec<f32> {
    let mut dx = vec![0.0; rows * n_in];
    for r in 0..rows {
        for i in 0..n_in {
            dx[r * n_in + i] = (0..n_out)
                .map(|o| dy[r * n_out + o] * w[o * n_in + i])
                .sum();
        }
    }
    dx
}

/// Rank `rank`'s micro-batch `micro` of step `step`: inputs in [-1, 1) from a fixed-seed
/// generator (splitmix64), the same on every run, and their labels (needs D >= C).
pub fn micro_batch(
    shape: &Shape,
    step: usize,
    micro: usize,
    rank: usize,
) -> (Vec<f32>, Vec<usize>) {
    let mut state = (((step * 64 + micro) * 64 + rank) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let mut next = move || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let x: Vec<f32> = (0..shape.batch * shape.inputs)
        .map(|_| (next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0)
        .collect();
    // Learnable: the label is which of the first C features is largest.
    let labels = x
        .chunks_exact(shape.inputs)
        .map(|row| (0..shape.classes).fold(0, |best, k| if row[k] > row[best] { k } else { best }))
        .collect();
    (x, labels)
}

/// Initial parameters of unit `unit`: a fixed pattern scaled by 1/sqrt(fan-in), the same on
/// every rank.
pub fn init(shape: &Shape, unit: usize, w: &mut [f32]) {
    let fan_in = match unit {
        0 => shape.inputs,
        _ => shape.hidden,
    } as f32;
    for (i, v) in w.iter_mut().enumerate() {
        let k = (i * 7919 + unit * 104_729) % 2001;
        *v = (k as f32 / 1000.0 - 1.0) / fan_in.sqrt();
    }
}
