//! The batched mapping run through a naive column-major strided-batched gemm (the BLAS
//! definition) and naive head permutes and softmax (`attention_gemm_naive.rs`), against the
//! CPU attention kernels.

use super::naive::{
    merge_heads, naive_batched, softmax_backward, softmax_forward, split_heads, to_bf16,
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

    fn forward(&self, qkv: &[f32], calls: [BatchedCall; 2]) -> (Vec<f32>, Vec<f32>) {
        let s = self.s;
        let mut scratch = vec![f32::NAN; self.layout.len];
        split_heads(self.region(&mut scratch, Region::Q), qkv, self.heads(3));
        naive_batched(&calls[0], &self.layout, &mut scratch, self.round);
        let mut att = vec![f32::NAN; s.b * s.t * s.nh * s.t];
        softmax_forward(self.region(&mut scratch, Region::Scores), &mut att, s);
        naive_batched(&calls[1], &self.layout, &mut scratch, self.round);
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
        calls: [BatchedCall; 4],
    ) {
        let mut scratch = vec![f32::NAN; self.layout.len];
        split_heads(self.region(&mut scratch, Region::Q), qkv, self.heads(3));
        split_heads(self.region(&mut scratch, Region::Y), dout, self.heads(1));
        let att_heads = (self.s.b, self.s.t, 1, self.s.nh, self.s.t);
        split_heads(self.region(&mut scratch, Region::Scores), att, att_heads);
        naive_batched(&calls[0], &self.layout, &mut scratch, self.round); // d(v)
        naive_batched(&calls[1], &self.layout, &mut scratch, self.round); // d(att)
        softmax_backward(self.region(&mut scratch, Region::Scores), att, self.s);
        naive_batched(&calls[2], &self.layout, &mut scratch, self.round); // d(q)
        naive_batched(&calls[3], &self.layout, &mut scratch, self.round); // d(k)
        merge_heads(
            dqkv,
            self.region(&mut scratch, Region::DQ),
            self.heads(3),
            true,
        );
    }
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
        let (out, att) = case.forward(&qkv, [scores(s), weighted_values(s)]);
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
        let calls = [d_values(s), d_weights(s), d_queries(s), d_keys(s)];
        case.backward(&mut dqkv, &dout, &qkv, &att, calls);
        assert!(
            max_diff(&dqkv, &want_dqkv) < 1e-4,
            "dqkv at {:?}",
            (b, t, c, nh)
        );
    }
}

#[test]
fn a_wrong_transpose_stride_or_leading_dimension_fails() {
    let (b, t, c, nh) = (2, 5, 6, 2);
    let case = Case::new(b, t, c, nh);
    let s = case.s;
    let [qkv, dout, dqkv0, want_out, _, want_dqkv] = cpu(b, t, c, nh);
    let forward_mutants = [
        BatchedCall {
            trans_a: false,
            ..scores(s)
        },
        BatchedCall {
            stride_b: 0,
            ..scores(s)
        },
        BatchedCall {
            trans_b: true,
            ..weighted_values(s)
        },
        BatchedCall {
            stride_c: i64::from(t as i32 * 2),
            ..weighted_values(s)
        },
    ];
    for (i, call) in forward_mutants.into_iter().enumerate() {
        let calls = if i < 2 {
            [call, weighted_values(s)]
        } else {
            [scores(s), call]
        };
        let caught = caught(|| max_diff(&case.forward(&qkv, calls).0, &want_out));
        assert!(caught, "forward mutant {i} passed");
    }
    let (_, att) = case.forward(&qkv, [scores(s), weighted_values(s)]);
    let good = [d_values(s), d_weights(s), d_queries(s), d_keys(s)];
    let mutants = [
        (
            0,
            BatchedCall {
                trans_b: false,
                ..good[0]
            },
        ),
        (
            1,
            BatchedCall {
                a: Region::Q,
                ..good[1]
            },
        ),
        (
            2,
            BatchedCall {
                trans_b: true,
                ..good[2]
            },
        ),
        (
            3,
            BatchedCall {
                ldb: s.hs as i32,
                ..good[3]
            },
        ),
        (
            3,
            BatchedCall {
                batch: good[3].batch - 1,
                ..good[3]
            },
        ),
    ];
    for (which, call) in mutants {
        let mut calls = good;
        calls[which] = call;
        let caught = caught(|| {
            let mut dqkv = dqkv0.clone();
            case.backward(&mut dqkv, &dout, &qkv, &att, calls);
            max_diff(&dqkv, &want_dqkv)
        });
        assert!(caught, "backward mutant {call:?} passed");
    }
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
    let (out, att) = case.forward(&qkv, [scores(s), weighted_values(s)]);
    let calls = [d_values(s), d_weights(s), d_queries(s), d_keys(s)];
    case.backward(&mut dqkv, &dout, &qkv, &att, calls);
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
