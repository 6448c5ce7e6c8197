//! The batched mapping run through a naive column-major strided-batched gemm (the BLAS
//! definition) and naive head permutes and softmax (`attention_gemm_naive.rs`), against the
//! CPU attention kernels.

use super::naive::{
    merge_heads, naive_batched, softmax_backward, softmax_forward, split_heads, to_bf16, Buffers,
};
use super::*;
use crate::kernels::{attention, fd};

struct Case {
    s: AttentionShape,
    c: usize,
    layout: AttentionScratch,
    /// What each product does to its inputs: nothing (`GemmMath::Exact`) or `to_bf16`.
    round: fn(f32) -> f32,
}

impl Case {
    fn new(b: usize, t: usize, c: usize, nh: usize) -> Self {
        let s = AttentionShape::new(b, t, c, nh).unwrap();
        let layout = AttentionScratch::new(s).unwrap();
        Self {
            s,
            c,
            layout,
            round: |x| x,
        }
    }
    fn heads(&self, w: usize) -> (usize, usize, usize, usize, usize) {
        (self.s.b, self.s.t, w, self.s.nh, self.s.hs)
    }
    fn region<'a>(&self, scratch: &'a mut [f32], r: Region) -> &'a mut [f32] {
        &mut scratch[self.layout.offset(r)..]
    }
    /// Runs every call of `step` through the naive gemm.
    fn run(&self, step: &[BatchedCall], scratch: &mut [f32], att: &mut [f32]) {
        let mut buffers = Buffers {
            layout: &self.layout,
            scratch,
            att,
        };
        for call in step {
            naive_batched(call, &mut buffers, self.round);
        }
    }

    /// out and att from qkv, both starting as NaN, as does the scratch: an element read
    /// before it is written shows.
    fn forward(&self, qkv: &[f32], steps: [Vec<BatchedCall>; 2]) -> (Vec<f32>, Vec<f32>) {
        let s = self.s;
        let mut scratch = vec![f32::NAN; self.layout.len];
        let mut att = vec![f32::NAN; s.b * s.t * s.nh * s.t];
        split_heads(self.region(&mut scratch, Region::Q), qkv, self.heads(3));
        self.run(&steps[0], &mut scratch, &mut att); // att = q kᵀ
        softmax_forward(&mut att, s);
        self.run(&steps[1], &mut scratch, &mut att); // y = att v
        let mut out = vec![f32::NAN; s.b * s.t * self.c];
        merge_heads(
            &mut out,
            self.region(&mut scratch, Region::Y),
            self.heads(1),
            false,
        );
        (out, att)
    }

    fn backward(
        &self,
        dqkv: &mut [f32],
        dout: &[f32],
        qkv: &[f32],
        att: &[f32],
        steps: [Vec<BatchedCall>; 4],
    ) {
        let mut scratch = vec![f32::NAN; self.layout.len];
        // The backend's att is read-only here; a copy lets the naive gemm take it mutably,
        // and the check below proves no step wrote it.
        let mut att_seen = att.to_vec();
        split_heads(self.region(&mut scratch, Region::Q), qkv, self.heads(3));
        split_heads(self.region(&mut scratch, Region::Y), dout, self.heads(1));
        self.run(&steps[0], &mut scratch, &mut att_seen); // d(v)
        self.run(&steps[1], &mut scratch, &mut att_seen); // d(att)
        softmax_backward(self.region(&mut scratch, Region::Scores), att, self.s);
        self.run(&steps[2], &mut scratch, &mut att_seen); // d(q)
        self.run(&steps[3], &mut scratch, &mut att_seen); // d(k)
        assert!(att_seen
            .iter()
            .zip(att)
            .all(|(x, y)| x.to_bits() == y.to_bits()));
        merge_heads(
            dqkv,
            self.region(&mut scratch, Region::DQ),
            self.heads(3),
            true,
        );
    }
}

fn forward_steps(s: AttentionShape) -> [Vec<BatchedCall>; 2] {
    [scores(s), weighted_values(s)]
}

fn backward_steps(s: AttentionShape) -> [Vec<BatchedCall>; 4] {
    [d_values(s), d_weights(s), d_queries(s), d_keys(s)]
}

/// The largest absolute difference; infinite where either side is NaN (an unwritten
/// scratch element), so a NaN never passes a tolerance.
fn max_diff(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    got.iter()
        .zip(want)
        .map(|(g, w)| {
            let d = (g - w).abs();
            if d.is_nan() {
                f32::INFINITY
            } else {
                d
            }
        })
        .fold(0.0, f32::max)
}

/// CPU forward (out, att) and backward (dqkv, accumulated onto a non-zero start).
fn cpu(b: usize, t: usize, c: usize, nh: usize) -> [Vec<f32>; 6] {
    let qkv = fd::random(b * t * 3 * c, 1, 1.5);
    let dout = fd::random(b * t * c, 2, 1.0);
    let dqkv0 = fd::random(b * t * 3 * c, 3, 1.0);
    let (mut out, mut att) = (vec![0.0; b * t * c], vec![0.0; b * t * nh * t]);
    attention::attention_forward(&mut out, &mut att, &qkv, b, t, c, nh);
    let mut dqkv = dqkv0.clone();
    attention::attention_backward(&mut dqkv, &dout, &qkv, &att, b, t, c, nh);
    [qkv, dout, dqkv0, out, att, dqkv]
}

const SHAPES: [(usize, usize, usize, usize); 3] = [(2, 5, 6, 2), (1, 7, 12, 3), (3, 4, 8, 1)];

#[test]
fn batched_products_compute_the_cpu_attention() {
    for (b, t, c, nh) in SHAPES {
        let case = Case::new(b, t, c, nh);
        let s = case.s;
        let [qkv, dout, mut dqkv, want_out, want_att, want_dqkv] = cpu(b, t, c, nh);
        let (out, att) = case.forward(&qkv, forward_steps(s));
        assert!(
            max_diff(&out, &want_out) < 1e-5,
            "out at {:?}",
            (b, t, c, nh)
        );
        assert!(
            max_diff(&att, &want_att) < 1e-6,
            "att at {:?}",
            (b, t, c, nh)
        );
        case.backward(&mut dqkv, &dout, &qkv, &att, backward_steps(s));
        assert!(
            max_diff(&dqkv, &want_dqkv) < 1e-4,
            "dqkv at {:?}",
            (b, t, c, nh)
        );
    }
}

/// `step` with `change` applied to every call.
fn mutate(step: &[BatchedCall], change: impl Fn(BatchedCall) -> BatchedCall) -> Vec<BatchedCall> {
    step.iter().map(|&c| change(c)).collect()
}

#[test]
fn a_wrong_forward_transpose_stride_leading_dimension_or_batch_fails() {
    let (b, t, c, nh) = (2, 5, 6, 2);
    let case = Case::new(b, t, c, nh);
    let [qkv, _, _, want_out, _, _] = cpu(b, t, c, nh);
    for (which, step) in forward_mutants(case.s) {
        let mut steps = forward_steps(case.s);
        steps[which] = step;
        let caught = caught(|| max_diff(&case.forward(&qkv, steps).0, &want_out));
        assert!(caught, "forward mutant of step {which} passed");
    }
}

#[test]
fn a_wrong_backward_transpose_stride_leading_dimension_or_batch_fails() {
    let (b, t, c, nh) = (2, 5, 6, 2);
    let case = Case::new(b, t, c, nh);
    let [qkv, dout, dqkv0, _, _, want_dqkv] = cpu(b, t, c, nh);
    let (_, att) = case.forward(&qkv, forward_steps(case.s));
    for (which, step) in backward_mutants(case.s) {
        let mut steps = backward_steps(case.s);
        steps[which] = step;
        let caught = caught(|| {
            let mut dqkv = dqkv0.clone();
            case.backward(&mut dqkv, &dout, &qkv, &att, steps);
            max_diff(&dqkv, &want_dqkv)
        });
        assert!(caught, "backward mutant of step {which} passed");
    }
}

/// Forward steps with one call wrong (a transpose, stride, leading dimension or batch), each
/// with the index of the step it replaces.
fn forward_mutants(s: AttentionShape) -> [(usize, Vec<BatchedCall>); 9] {
    let (t32, nh32) = (s.t as i32, s.nh as i32);
    let [sc, wv] = forward_steps(s);
    [
        (
            0,
            mutate(&sc, |c| BatchedCall {
                trans_a: false,
                ..c
            }),
        ),
        (0, mutate(&sc, |c| BatchedCall { stride_b: 0, ..c })),
        (0, mutate(&sc, |c| BatchedCall { ldc: t32, ..c })), // att's ld
        (
            0,
            mutate(&sc, |c| BatchedCall {
                stride_c: i64::from(t32 * t32),
                ..c
            }),
        ),
        (
            0,
            mutate(&sc, |c| BatchedCall {
                batch: nh32 - 1,
                ..c
            }),
        ),
        (0, sc[..1].to_vec()), // batch row 0 only
        (1, mutate(&wv, |c| BatchedCall { trans_b: true, ..c })),
        (1, mutate(&wv, |c| BatchedCall { ldb: t32, ..c })),
        (
            1,
            mutate(&wv, |c| BatchedCall {
                stride_c: i64::from(t32 * 2),
                ..c
            }),
        ),
    ]
}

/// As [`forward_mutants`], for the backward steps.
fn backward_mutants(s: AttentionShape) -> [(usize, Vec<BatchedCall>); 9] {
    let (t32, nh32) = (s.t as i32, s.nh as i32);
    let [dv, dw, dq, dk] = backward_steps(s);
    [
        (
            0,
            mutate(&dv, |c| BatchedCall {
                trans_b: false,
                ..c
            }),
        ),
        (0, mutate(&dv, |c| BatchedCall { ldb: t32, ..c })),
        (
            0,
            mutate(&dv, |c| BatchedCall {
                stride_b: i64::from(t32 * t32),
                ..c
            }),
        ),
        (
            0,
            mutate(&dv, |c| BatchedCall {
                batch: nh32 + 1,
                ..c
            }),
        ),
        (1, mutate(&dw, |c| BatchedCall { a: dk[0].a, ..c })), // q for v
        (2, mutate(&dq, |c| BatchedCall { trans_b: true, ..c })),
        (
            3,
            mutate(&dk, |c| BatchedCall {
                ldb: s.hs as i32,
                ..c
            }),
        ),
        (
            3,
            mutate(&dk, |c| BatchedCall {
                batch: c.batch - 1,
                ..c
            }),
        ),
        (3, mutate(&dk, |c| BatchedCall { stride_a: 0, ..c })),
    ]
}

/// True when a mutant is caught: the reference gemm refuses its call (a BLAS argument rule,
/// or a matrix leaving its region: a panic), or its result is off by 1e-3 or more.
fn caught(run: impl FnOnce() -> f32) -> bool {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)).map_or(true, |diff| diff >= 1e-3)
}

#[test]
fn scratch_layout_and_overflow_checks() {
    let layout = Case::new(4, 1024, 768, 12).layout;
    // 7 (B,NH,T,hs) regions + (B,NH,T,T): 289,406,976 bytes at GPT-2 124M, B = 4, T = 1024.
    assert_eq!(layout.len * 4, 289_406_976);
    assert_eq!(layout.offset(Region::K), 4 * 1024 * 768);
    assert_eq!(layout.offset(Region::Scores), 7 * 4 * 1024 * 768);
    assert!(AttentionShape::new(1, 1 << 16, 64, 1).is_err()); // T*T = 2^32
    assert!(AttentionShape::new(1 << 20, 1, 1 << 12, 1 << 12).is_err()); // B*NH = 2^32
    assert!(AttentionShape::new(1, 1 << 20, 1 << 12, 1).is_err()); // T*hs = 2^32
    assert!(AttentionShape::new(usize::MAX / 2, 4, 4, 1).is_err()); // scratch length
    assert!(AttentionShape::new(1, usize::MAX, 1, 1).is_err()); // T
    assert!(AttentionShape::new(1, 1 << 15, 1 << 16, 1 << 16).is_err()); // NH*T = 2^31
}

/// With bf16-rounded inputs to every product (fp32 accumulation, as cuBLAS's
/// `CUBLAS_COMPUTE_32F_FAST_16BF`), the pipeline stays within the tolerances the GPU test
/// `attention_in_bf16_math_is_within_bf16_rounding` (tests/cuda_kernels.rs) allows, at its
/// shape and input scales: the evidence for those tolerances.
#[test]
fn bf16_products_stay_within_the_gpu_tests_tolerances() {
    let (b, t, c, nh) = (2, 7, 40, 2);
    let case = Case {
        round: to_bf16,
        ..Case::new(b, t, c, nh)
    };
    let s = case.s;
    let [qkv, dout, mut dqkv, want_out, want_att, want_dqkv] = cpu(b, t, c, nh);
    let (out, att) = case.forward(&qkv, forward_steps(s));
    case.backward(&mut dqkv, &dout, &qkv, &att, backward_steps(s));
    let errors = [
        max_diff(&out, &want_out),
        max_diff(&att, &want_att),
        max_diff(&dqkv, &want_dqkv),
    ];
    println!("bf16 products: max |error| out, att, dqkv = {errors:?}");
    // The GPU test's limits (out, att, dqkv), 4x or more above what this emulation gives
    // (6.8e-3, 1.3e-3, 4.5e-3 here), a margin for cuBLAS's own summation order.
    let limits = [3e-2, 1e-2, 5e-2];
    for (e, l) in errors.iter().zip(limits) {
        assert!(*e < l, "{errors:?} vs {limits:?}");
    }
    // And bf16 rounding is visible: the emulation is not the exact pipeline.
    assert!(errors[0] > 1e-5, "{errors:?}");
}
