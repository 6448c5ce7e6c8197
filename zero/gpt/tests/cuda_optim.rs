//! The optimizer-side CUDA kernels against plain host formulas (AdamW, sum of squares,
//! inf/NaN check, rank-order sum). Skips without a GPU unless `ZERO_GPT_REQUIRE_GPU=1`.

#![cfg(feature = "cuda")]

use cudarc::driver::CudaSlice;
use zero_gpt::cuda::{AdamWStep, CudaBackend, DeviceSlice, HalfCopy};
use zero_gpt::Rng;

fn gpu(test: &str) -> Option<CudaBackend> {
    match CudaBackend::new(0) {
        Ok(b) => Some(b),
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

fn random(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    (0..n)
        .map(|_| ((rng.uniform() * 2.0 - 1.0) as f32) * scale)
        .collect()
}

fn up(g: &CudaBackend, x: &[f32]) -> CudaSlice<f32> {
    g.stream().clone_htod(x).expect("upload")
}
fn down(g: &CudaBackend, x: &CudaSlice<f32>) -> Vec<f32> {
    g.synchronize().expect("kernels ran");
    g.stream().clone_dtoh(x).expect("download")
}

/// The 2-byte values held in f32 slots, in element order (little-endian halves).
fn halves(slots: &[f32], n: usize) -> Vec<u16> {
    slots
        .iter()
        .flat_map(|s| [s.to_bits() as u16, (s.to_bits() >> 16) as u16])
        .take(n)
        .collect()
}

#[test]
fn adamw_matches_the_update_formula_bitwise_with_half_copies() {
    let Some(g) = gpu("adamw") else { return };
    let n = 1001;
    let s = AdamWStep::new(0.9, 0.95, 1e-8, 0.1, 3e-4, 7, true);
    let (p0, gr, m0, v0) = (
        random(n, 1, 1.0),
        random(n, 2, 1.0),
        random(n, 3, 0.1),
        random(n, 4, 0.01)
            .iter()
            .map(|x| x.abs())
            .collect::<Vec<_>>(),
    );
    let (mut p, mut m, mut v) = (p0.clone(), m0.clone(), v0.clone());
    for i in 0..n {
        m[i] = s.beta1 * m[i] + (1.0 - s.beta1) * gr[i];
        v[i] = s.beta2 * v[i] + (1.0 - s.beta2) * gr[i] * gr[i];
        p[i] = p[i] * s.decay - s.step_size * (m[i] / (v[i].sqrt() * s.inv_sqrt_bc2 + s.eps));
    }
    for which in 0..3 {
        let (mut gp, mut gm, mut gv, gg) = (up(&g, &p0), up(&g, &m0), up(&g, &v0), up(&g, &gr));
        let mut half = up(&g, &vec![0.0; n.div_ceil(2)]);
        let st = g.stream().clone();
        let hv = DeviceSlice::of_mut(&mut half, &st);
        let copy = match which {
            0 => HalfCopy::None,
            1 => HalfCopy::Bf16(hv),
            _ => HalfCopy::F16(hv),
        };
        g.adamw_update(
            DeviceSlice::of_mut(&mut gp, &st),
            DeviceSlice::of_mut(&mut gm, &st),
            DeviceSlice::of_mut(&mut gv, &st),
            DeviceSlice::of(&gg, &st),
            copy,
            s,
        );
        for (what, got, want) in [
            ("p", down(&g, &gp), &p),
            ("m", down(&g, &gm), &m),
            ("v", down(&g, &gv), &v),
        ] {
            assert!(
                got.iter()
                    .zip(want.iter())
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{what} differs"
            );
        }
        let bits = halves(&down(&g, &half), n);
        let want: Vec<u16> = match which {
            0 => vec![0; n],
            1 => p
                .iter()
                .map(|&x| half::bf16::from_f32(x).to_bits())
                .collect(),
            _ => p
                .iter()
                .map(|&x| half::f16::from_f32(x).to_bits())
                .collect(),
        };
        assert_eq!(bits, want, "half copy {which}");
    }
}

#[test]
fn sum_of_squares_matches_an_f64_sum() {
    let Some(g) = gpu("sum_of_squares") else {
        return;
    };
    for n in [1, 255, 4097, 1 << 20] {
        let x = random(n, n as u64, 3.0);
        let want: f64 = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
        let gx = up(&g, &x);
        let got = g
            .sum_of_squares(DeviceSlice::of(&gx, g.stream()))
            .expect("sum");
        assert!(
            ((got - want) / want).abs() < 1e-12,
            "n={n}: {got} vs {want}"
        );
    }
}

#[test]
fn nonfinite_check_finds_inf_and_nan_only() {
    let Some(g) = gpu("nonfinite") else { return };
    let mut x = random(3000, 1, 1e30);
    let clean = up(&g, &x);
    assert!(!g
        .has_nonfinite(DeviceSlice::of(&clean, g.stream()))
        .expect("check"));
    for bad in [f32::INFINITY, f32::NEG_INFINITY, f32::NAN] {
        x[2999] = bad;
        let gx = up(&g, &x);
        assert!(
            g.has_nonfinite(DeviceSlice::of(&gx, g.stream()))
                .expect("check"),
            "{bad}"
        );
    }
}

#[test]
fn rank_order_sum_is_the_left_fold_bitwise_past_sixteen_inputs() {
    let Some(g) = gpu("sum_in_rank_order") else {
        return;
    };
    let (k, n) = (37usize, 513);
    let inputs: Vec<Vec<f32>> = (0..k)
        .map(|r| random(n, r as u64, 10f32.powi((r % 7) as i32 - 3)))
        .collect();
    let mut want = inputs[0].clone();
    for x in &inputs[1..] {
        for (w, &v) in want.iter_mut().zip(x) {
            *w += v;
        }
    }
    let dev: Vec<CudaSlice<f32>> = inputs.iter().map(|x| up(&g, x)).collect();
    let mut out = up(&g, &vec![0.0; n]);
    let st = g.stream().clone();
    let views: Vec<&DeviceSlice> = dev.iter().map(|d| DeviceSlice::of(d, &st)).collect();
    g.sum_in_rank_order(DeviceSlice::of_mut(&mut out, &st), &views);
    let got = down(&g, &out);
    assert!(got
        .iter()
        .zip(&want)
        .all(|(a, b)| a.to_bits() == b.to_bits()));
}
