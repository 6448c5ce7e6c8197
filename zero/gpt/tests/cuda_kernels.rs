//! Each CUDA kernel against its CPU twin on random inputs, with the contract its `.cu`
//! comment states: `bitwise` (every bit equal) or a tolerance.
//!
//! Needs a GPU. Without one each test prints that it skipped and why, unless
//! `ZERO_GPT_REQUIRE_GPU=1` (set by scripts/gpu-check.sh), which makes the skip a failure.

#![cfg(feature = "cuda")]

use cudarc::driver::CudaSlice;
use zero_gpt::cuda::column_sums::{chunked_column_sums, COLUMN_CHUNK_ROWS};
use zero_gpt::cuda::{CudaBackend, DeviceIds, DeviceSlice, GemmMath};
use zero_gpt::kernels::{attention, cross_entropy, encoder, gelu, layernorm, matmul, residual};
use zero_gpt::{Backend, Rng};

struct Gpu(CudaBackend);

fn gpu(test: &str) -> Option<Gpu> {
    match CudaBackend::new(0) {
        Ok(b) => Some(Gpu(b)),
        Err(e) => {
            assert!(
                std::env::var("ZERO_GPT_REQUIRE_GPU").as_deref() != Ok("1"),
                "ZERO_GPT_REQUIRE_GPU=1 but {e}"
            );
            println!("{test}: skipped: {e}");
            None
        }
    }
}

impl Gpu {
    fn up(&self, x: &[f32]) -> CudaSlice<f32> {
        self.0.stream().clone_htod(x).expect("upload")
    }
    fn ids(&self, x: &[u32]) -> CudaSlice<u32> {
        self.0.stream().clone_htod(x).expect("upload ids")
    }
    fn down(&self, x: &CudaSlice<f32>) -> Vec<f32> {
        self.0.synchronize().expect("kernels ran");
        self.0.stream().clone_dtoh(x).expect("download")
    }
}

fn view<'a>(g: &'a Gpu, s: &'a CudaSlice<f32>) -> &'a DeviceSlice {
    DeviceSlice::of(s, g.0.stream())
}
fn view_mut<'a>(g: &'a Gpu, s: &'a mut CudaSlice<f32>) -> &'a mut DeviceSlice {
    DeviceSlice::of_mut(s, g.0.stream())
}
fn view_ids<'a>(g: &'a Gpu, s: &'a CudaSlice<u32>) -> &'a DeviceIds {
    DeviceIds::of(s, g.0.stream())
}

fn random(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    (0..n)
        .map(|_| ((rng.uniform() * 2.0 - 1.0) as f32) * scale)
        .collect()
}

fn assert_bitwise(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.to_bits(), w.to_bits(), "{what}[{i}]: gpu {g} cpu {w}");
    }
}

fn assert_close(what: &str, got: &[f32], want: &[f32], abs: f32, rel: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= abs + rel * w.abs(),
            "{what}[{i}]: gpu {g} cpu {w}"
        );
    }
}

/// A column reduction's contract (cuda::column_sums): `got` has the bits of the chunked
/// order from `init` over `rows` rows of `term`, and is within 1e-5 * (|init| + Σ|term|) of
/// `cpu`, the CPU kernel's sequential sum.
fn assert_column_sums(
    what: &str,
    got: &[f32],
    cpu: &[f32],
    init: &[f32],
    rows: usize,
    term: impl Fn(usize, usize) -> f32,
) {
    let mut chunked = init.to_vec();
    chunked_column_sums(&mut chunked, rows, COLUMN_CHUNK_ROWS, &term);
    assert_bitwise(&format!("{what} (chunked order)"), got, &chunked);
    for (j, (&g, &w)) in got.iter().zip(cpu).enumerate() {
        let scale = init[j].abs() + (0..rows).map(|r| term(r, j).abs()).sum::<f32>();
        assert!(
            (g - w).abs() <= 1e-5 * scale,
            "{what}[{j}]: gpu {g} cpu {w}"
        );
    }
}

/// dwte and dwpe of `tokens`, on the GPU from the ids in `gtok` and on the CPU, bitwise.
fn encoder_backward_case(g: &Gpu, gtok: &CudaSlice<u32>, tokens: &[u32], vp: usize) {
    let (b, t, c) = (4, 40, 300); // C: a block of 256 threads and 44 more
    let (dout, dwte, dwpe) = (
        random(b * t * c, 3, 1.0),
        random(vp * c, 4, 1.0),
        random(t * c, 5, 1.0),
    );
    let (mut gdwte, mut gdwpe, gdout) = (g.up(&dwte), g.up(&dwpe), g.up(&dout));
    let (mut dwte, mut dwpe) = (dwte, dwpe);
    encoder::encoder_backward(&mut dwte, &mut dwpe, &dout, tokens, b, t, c);
    g.0.encoder_backward(
        view_mut(g, &mut gdwte),
        view_mut(g, &mut gdwpe),
        view(g, &gdout),
        view_ids(g, gtok),
        b,
        t,
        c,
    );
    assert_bitwise("dwte", &g.down(&gdwte), &dwte);
    assert_bitwise("dwpe", &g.down(&gdwpe), &dwpe);
}

#[test]
fn encoder_backward_wte_is_bitwise_grouped_unknown_and_changed_ids() {
    let Some(g) = gpu("encoder_backward_wte") else {
        return;
    };
    let vp = 13;
    // Skewed: token 0 at every third position, the rest spread.
    let tokens: Vec<u32> = (0..160u32)
        .map(|i| if i % 3 == 0 { 0 } else { i * 7 % 13 })
        .collect();
    // Uploaded by the backend: grouped by token, the grouped kernel runs.
    let mut gtok = g.ids(&vec![0; tokens.len()]);
    g.0.upload_ids(DeviceIds::of_mut(&mut gtok, g.0.stream()), &tokens);
    encoder_backward_case(&g, &gtok, &tokens, vp);
    // Changed on the device behind the backend's back: the check sends it to the fallback.
    let changed: Vec<u32> = tokens.iter().map(|&x| (x + 1) % 13).collect();
    g.0.stream()
        .memcpy_htod(&changed, &mut gtok)
        .expect("overwrite ids");
    encoder_backward_case(&g, &gtok, &changed, vp);
    // Never uploaded through the backend: the one-thread-per-channel kernel.
    let fresh = g.ids(&tokens);
    encoder_backward_case(&g, &fresh, &tokens, vp);
}

#[test]
fn encoder_matches_cpu_bitwise() {
    let Some(g) = gpu("encoder") else { return };
    let (b, t, c, vp) = (2, 5, 24, 11);
    let tokens: Vec<u32> = (0..b * t).map(|i| (i * 7 % 4) as u32).collect(); // repeats
    let (wte, wpe, dout) = (
        random(vp * c, 1, 1.0),
        random(t * c, 2, 1.0),
        random(b * t * c, 3, 1.0),
    );
    let mut out = vec![0.0; b * t * c];
    encoder::encoder_forward(&mut out, &tokens, &wte, &wpe, b, t, c);
    let (mut dwte, mut dwpe) = (random(vp * c, 4, 1.0), random(t * c, 5, 1.0));
    let (mut gdwte, mut gdwpe) = (g.up(&dwte), g.up(&dwpe));
    encoder::encoder_backward(&mut dwte, &mut dwpe, &dout, &tokens, b, t, c);

    let (gwte, gwpe, gdout, gtok) = (g.up(&wte), g.up(&wpe), g.up(&dout), g.ids(&tokens));
    let mut gout = g.up(&vec![0.0; b * t * c]);
    g.0.encoder_forward(
        view_mut(&g, &mut gout),
        view_ids(&g, &gtok),
        view(&g, &gwte),
        view(&g, &gwpe),
        b,
        t,
        c,
    );
    g.0.encoder_backward(
        view_mut(&g, &mut gdwte),
        view_mut(&g, &mut gdwpe),
        view(&g, &gdout),
        view_ids(&g, &gtok),
        b,
        t,
        c,
    );
    assert_bitwise("out", &g.down(&gout), &out);
    assert_bitwise("dwte", &g.down(&gdwte), &dwte);
    assert_bitwise("dwpe", &g.down(&gdwpe), &dwpe);
}

#[test]
fn layernorm_matches_cpu_within_tolerance_and_param_grads_in_the_chunked_order() {
    let Some(g) = gpu("layernorm") else { return };
    // N: two whole chunks of 64 rows and 9 more; C: a block of 256 channels and 44 more.
    let (n, c) = (137, 300);
    let (x, w, bias, dout) = (
        random(n * c, 1, 2.0),
        random(c, 2, 1.0),
        random(c, 3, 1.0),
        random(n * c, 4, 1.0),
    );
    let (mut out, mut mean, mut rstd) = (vec![0.0; n * c], vec![0.0; n], vec![0.0; n]);
    layernorm::layernorm_forward(&mut out, &mut mean, &mut rstd, &x, &w, &bias, n, c);
    let (mut dx, mut dw, mut db) = (random(n * c, 5, 1.0), random(c, 6, 1.0), random(c, 7, 1.0));
    let (mut gdx, mut gdw, mut gdb) = (g.up(&dx), g.up(&dw), g.up(&db));
    let (dw0, db0) = (dw.clone(), db.clone());
    layernorm::layernorm_backward(&mut dx, &mut dw, &mut db, &dout, &x, &w, &mean, &rstd, n, c);

    let (gx, gw, gb, gdout) = (g.up(&x), g.up(&w), g.up(&bias), g.up(&dout));
    // NaN-filled outputs: a kernel that wrote nothing cannot pass.
    let nan = |len: usize| g.up(&vec![f32::NAN; len]);
    let (mut gout, mut gmean, mut grstd) = (nan(n * c), nan(n), nan(n));
    g.0.layernorm_forward(
        view_mut(&g, &mut gout),
        view_mut(&g, &mut gmean),
        view_mut(&g, &mut grstd),
        view(&g, &gx),
        view(&g, &gw),
        view(&g, &gb),
        n,
        c,
    );
    assert_close("out", &g.down(&gout), &out, 1e-4, 0.0);
    assert_close("mean", &g.down(&gmean), &mean, 1e-6, 1e-5);
    assert_close("rstd", &g.down(&grstd), &rstd, 0.0, 1e-5);
    // Backward from the CPU's saved statistics, so the parameter terms are the CPU's.
    let (cmean, crstd) = (g.up(&mean), g.up(&rstd));
    g.0.layernorm_backward(
        view_mut(&g, &mut gdx),
        view_mut(&g, &mut gdw),
        view_mut(&g, &mut gdb),
        view(&g, &gdout),
        view(&g, &gx),
        view(&g, &gw),
        view(&g, &cmean),
        view(&g, &crstd),
        n,
        c,
    );
    assert_close("dinp", &g.down(&gdx), &dx, 1e-4, 0.0);
    let norm_term = |r: usize, j: usize| (x[r * c + j] - mean[r]) * rstd[r] * dout[r * c + j];
    assert_column_sums("dweight", &g.down(&gdw), &dw, &dw0, n, norm_term);
    assert_column_sums("dbias", &g.down(&gdb), &db, &db0, n, |r, j| dout[r * c + j]);
}

/// The layer's forward and backward on the GPU in `math` mode against the CPU; each product
/// of K terms within `abs + per_term * K` of it, the bias gradient in the chunked order.
fn matmul_case(mut g: Gpu, math: GemmMath, abs: f32, per_term: f32) {
    g.0.set_gemm_math(math);
    let (n, c, oc) = (33, 40, 24);
    let (x, w, bias, dout) = (
        random(n * c, 1, 1.0),
        random(oc * c, 2, 1.0),
        random(oc, 3, 1.0),
        random(n * oc, 4, 1.0),
    );
    let mut out = vec![0.0; n * oc];
    matmul::matmul_forward(&mut out, &x, &w, Some(&bias), n, c, oc);
    let (mut dx, mut dw, mut db) = (
        random(n * c, 5, 1.0),
        random(oc * c, 6, 1.0),
        random(oc, 7, 1.0),
    );
    let (mut gdx, mut gdw, mut gdb) = (g.up(&dx), g.up(&dw), g.up(&db));
    let db0 = db.clone();
    matmul::matmul_backward(&mut dx, &mut dw, Some(&mut db), &dout, &x, &w, n, c, oc);

    let (gx, gw, gbias, gdout) = (g.up(&x), g.up(&w), g.up(&bias), g.up(&dout));
    let mut gout = g.up(&vec![7.0; n * oc]);
    g.0.matmul_forward(
        view_mut(&g, &mut gout),
        view(&g, &gx),
        view(&g, &gw),
        Some(view(&g, &gbias)),
        n,
        c,
        oc,
    );
    g.0.matmul_backward(
        view_mut(&g, &mut gdx),
        view_mut(&g, &mut gdw),
        Some(view_mut(&g, &mut gdb)),
        view(&g, &gdout),
        view(&g, &gx),
        view(&g, &gw),
        n,
        c,
        oc,
    );
    let tol = |k: usize| abs + per_term * k as f32;
    assert_close("out", &g.down(&gout), &out, tol(c), 1e-6);
    assert_close("dinp", &g.down(&gdx), &dx, tol(oc), 1e-6);
    assert_close("dweight", &g.down(&gdw), &dw, tol(n), 1e-6);
    assert_column_sums("dbias", &g.down(&gdb), &db, &db0, n, |r, j| {
        dout[r * oc + j]
    });
}

#[test]
fn bias_backward_is_the_chunked_order_and_deterministic() {
    let Some(g) = gpu("bias_backward") else {
        return;
    };
    // N: 4 whole chunks and 3 rows more; OC: two blocks of 256 columns and 31 more.
    let (n, c, oc) = (259, 3, 543);
    let (x, dout, db) = (
        random(n * c, 1, 1.0),
        random(n * oc, 2, 1.0),
        random(oc, 3, 1.0),
    );
    let mut cpu = db.clone();
    let mut dw = vec![0.0; oc * c];
    matmul::matmul_backward_weight(&mut dw, Some(&mut cpu), &dout, &x, n, c, oc);
    let (gx, gdout) = (g.up(&x), g.up(&dout));
    let mut runs = Vec::new();
    for _ in 0..2 {
        let (mut gdw, mut gdb) = (g.up(&vec![0.0; oc * c]), g.up(&db));
        g.0.matmul_backward_weight(
            view_mut(&g, &mut gdw),
            Some(view_mut(&g, &mut gdb)),
            view(&g, &gdout),
            view(&g, &gx),
            n,
            c,
            oc,
        );
        runs.push(g.down(&gdb));
    }
    assert_column_sums("dbias", &runs[0], &cpu, &db, n, |r, j| dout[r * oc + j]);
    assert_bitwise("dbias, second run", &runs[1], &runs[0]);
}

#[test]
fn matmul_matches_cpu_within_tolerance_and_dbias_in_the_chunked_order() {
    let Some(g) = gpu("matmul") else { return };
    // fp32 products of K <= 40 terms of order 1, summed in another order: 1e-4 absolute.
    matmul_case(g, GemmMath::Exact, 1e-4, 0.0);
}

#[test]
fn matmul_in_bf16_math_is_within_bf16_rounding() {
    let Some(g) = gpu("matmul_bf16") else { return };
    // Inputs |x| <= 1 rounded to bf16 (8 significant bits: relative error <= 2^-8 rounded to
    // nearest, < 2^-7 if cuBLAS truncates) make each product a*b off by < 2 * 2^-7 |a b| <
    // 1.6e-2; accumulation is fp32. K terms: at most K * 1.6e-2 (0.64 at K = 40), while a
    // wrong mapping is off by the size of the sums themselves, O(sqrt(K)).
    matmul_case(g, GemmMath::Bf16, 1e-4, 1.6e-2);
}

/// Attention forward and backward on the GPU in `math` mode against the CPU: out, att and
/// dqkv (accumulated onto non-zero values) within `tol` = (out, att, dqkv) absolute.
fn attention_case(mut g: Gpu, math: GemmMath, tol: [f32; 3]) {
    g.0.set_gemm_math(math);
    // hs = 20, T = 7: products over a whole 16-lane chunk plus a tail, odd row lengths.
    let (b, t, c, nh) = (2, 7, 40, 2);
    let (qkv, dout) = (random(b * t * 3 * c, 1, 1.5), random(b * t * c, 2, 1.0));
    let (mut out, mut att) = (vec![0.0; b * t * c], vec![0.0; b * t * nh * t]);
    attention::attention_forward(&mut out, &mut att, &qkv, b, t, c, nh);
    let mut dqkv = random(b * t * 3 * c, 3, 1.0); // non-zero: backward accumulates
    let mut gdqkv = g.up(&dqkv);
    attention::attention_backward(&mut dqkv, &dout, &qkv, &att, b, t, c, nh);

    let (gqkv, gdout) = (g.up(&qkv), g.up(&dout));
    // NaN outputs: an element the GPU does not write fails assert_close.
    let (mut gout, mut gatt) = (
        g.up(&vec![f32::NAN; b * t * c]),
        g.up(&vec![f32::NAN; b * t * nh * t]),
    );
    g.0.attention_forward(
        view_mut(&g, &mut gout),
        view_mut(&g, &mut gatt),
        view(&g, &gqkv),
        b,
        t,
        c,
        nh,
    );
    g.0.attention_backward(
        view_mut(&g, &mut gdqkv),
        view(&g, &gdout),
        view(&g, &gqkv),
        view(&g, &gatt),
        b,
        t,
        c,
        nh,
    );
    let gatt = g.down(&gatt);
    let first_out = g.down(&gout);
    assert_close("out", &first_out, &out, tol[0], 0.0);
    assert_close("att", &gatt, &att, tol[1], 0.0);
    assert_close("dqkv", &g.down(&gdqkv), &dqkv, tol[2], 0.0);
    // Masked entries are exact zeros, as on the CPU.
    for (i, row) in gatt.chunks(t).enumerate() {
        let ti = (i / nh) % t;
        assert!(row[ti + 1..].iter().all(|&w| w == 0.0), "att row {i}");
    }
    // No scratch was provided: the backend allocated attention's own, 4 * (7*B*T*C +
    // B*NH*T*T) bytes, and counts it. Once one is provided, that goes and the same forward
    // gives the same bits in the provided one.
    let layout = 4 * (7 * b * t * c + b * nh * t * t) as u64;
    assert_eq!(g.0.scratch_outside_bytes(), layout);
    g.0.provide_scratch(g.0.alloc(layout as usize / 4).unwrap());
    assert_eq!(g.0.scratch_outside_bytes(), 0);
    let mut gout = g.up(&vec![f32::NAN; b * t * c]);
    let mut gatt = g.up(&vec![f32::NAN; b * t * nh * t]);
    let (out_view, att_view) = (view_mut(&g, &mut gout), view_mut(&g, &mut gatt));
    g.0.attention_forward(out_view, att_view, view(&g, &gqkv), b, t, c, nh);
    assert_bitwise("out, provided scratch", &g.down(&gout), &first_out);
    assert_eq!(g.0.scratch_outside_bytes(), 0);
}

#[test]
fn attention_matches_cpu_within_fp32_tolerance() {
    let Some(g) = gpu("attention") else { return };
    // fp32 cuBLAS products (another summation order than math::dot) and warp-shuffle softmax
    // sums: the CPU emulation of this pipeline (cuda::attention_gemm's tests) is within 2e-7
    // of the CPU kernels; 1e-5 (out, att) and 1e-4 (dqkv, sums of T*hs products) absolute.
    attention_case(g, GemmMath::Exact, [1e-5, 1e-5, 1e-4]);
}

#[test]
fn attention_in_bf16_math_is_within_bf16_rounding() {
    let Some(g) = gpu("attention_bf16") else {
        return;
    };
    // Every product's inputs rounded to bf16: the CPU emulation of this pipeline with
    // bf16-rounded inputs (cuda::attention_gemm's test bf16_products_stay_within_the_gpu_
    // tests_tolerances) is off by 6.8e-3, 1.3e-3, 4.5e-3; these limits are 4x or more that.
    attention_case(g, GemmMath::Bf16, [3e-2, 1e-2, 5e-2]);
}

#[test]
fn gelu_and_residual_match_cpu_bitwise() {
    let Some(g) = gpu("gelu_residual") else {
        return;
    };
    let n = 1000;
    let (x, y, d) = (random(n, 1, 6.0), random(n, 2, 1.0), random(n, 3, 1.0));
    let mut out = vec![0.0; n];
    gelu::gelu_forward(&mut out, &x);
    let mut dx = random(n, 4, 1.0);
    let mut gdx = g.up(&dx);
    gelu::gelu_backward(&mut dx, &x, &d);
    let mut sum = vec![0.0; n];
    residual::residual_forward(&mut sum, &x, &y);
    let (mut r1, mut r2) = (random(n, 5, 1.0), random(n, 6, 1.0));
    let (mut gr1, mut gr2) = (g.up(&r1), g.up(&r2));
    residual::residual_backward(&mut r1, &mut r2, &d);

    let (gx, gy, gd) = (g.up(&x), g.up(&y), g.up(&d));
    let (mut gout, mut gsum) = (g.up(&vec![0.0; n]), g.up(&vec![0.0; n]));
    g.0.gelu_forward(view_mut(&g, &mut gout), view(&g, &gx));
    g.0.gelu_backward(view_mut(&g, &mut gdx), view(&g, &gx), view(&g, &gd));
    g.0.residual_forward(view_mut(&g, &mut gsum), view(&g, &gx), view(&g, &gy));
    g.0.residual_backward(
        view_mut(&g, &mut gr1),
        view_mut(&g, &mut gr2),
        view(&g, &gd),
    );
    assert_bitwise("gelu out", &g.down(&gout), &out);
    assert_bitwise("gelu dinp", &g.down(&gdx), &dx);
    assert_bitwise("residual out", &g.down(&gsum), &sum);
    assert_bitwise("residual dinp1", &g.down(&gr1), &r1);
    assert_bitwise("residual dinp2", &g.down(&gr2), &r2);
}

#[test]
fn crossentropy_probs_and_grads_bitwise_losses_within_ulps() {
    let Some(g) = gpu("crossentropy") else { return };
    let (n, v, vp) = (9, 37, 48); // V: two 16-chunks and a tail of 5
    let mut logits = random(n * vp, 1, 4.0);
    for row in logits.chunks_mut(vp) {
        row[v..].fill(1e9); // masked: must not matter
    }
    let targets: Vec<u32> = (0..n).map(|i| (i * 5 % v) as u32).collect();
    let dlosses = random(n, 2, 1.0);
    let mut glogits = g.up(&logits);
    let mut losses = vec![0.0; n];
    cross_entropy::crossentropy_forward(&mut losses, &mut logits, &targets, n, v, vp);
    let probs = logits.clone();
    cross_entropy::crossentropy_backward(&mut logits, &dlosses, &targets, n, v, vp);

    let (gt, gdl) = (g.ids(&targets), g.up(&dlosses));
    let mut glosses = g.up(&vec![0.0; n]);
    g.0.crossentropy_forward(
        view_mut(&g, &mut glosses),
        view_mut(&g, &mut glogits),
        view_ids(&g, &gt),
        n,
        v,
        vp,
    );
    assert_bitwise("probs", &g.down(&glogits), &probs);
    assert_close("losses", &g.down(&glosses), &losses, 1e-6, 4e-7);
    g.0.crossentropy_backward(
        view_mut(&g, &mut glogits),
        view(&g, &gdl),
        view_ids(&g, &gt),
        n,
        v,
        vp,
    );
    assert_bitwise("dlogits", &g.down(&glogits), &logits);
}
