//! The whole model on the GPU (`Gpt<CudaBackend>`) against the CPU model: loss and every
//! unit's gradient of one micro-step, with and without activation checkpointing.
//!
//! Needs a GPU. Without one it prints that it skipped and why, unless
//! `ZERO_GPT_REQUIRE_GPU=1`, which makes the skip a failure. It has not run on a GPU yet.
//!
//! Legend: B batch, T sequence.

#![cfg(feature = "cuda")]

use cudarc::driver::CudaSlice;
use zero_gpt::cuda::{CudaBackend, DeviceSlice};
use zero_gpt::{init_params, Backend, Gpt, GptConfig};

const B: usize = 2;
const T: usize = 8;

fn gpu() -> Option<CudaBackend> {
    match CudaBackend::new(0) {
        Ok(b) => Some(b),
        Err(e) => {
            assert!(
                std::env::var("ZERO_GPT_REQUIRE_GPU").as_deref() != Ok("1"),
                "ZERO_GPT_REQUIRE_GPU=1 but {e}"
            );
            println!("skipped: {e}");
            None
        }
    }
}

/// Tokens and targets of one (B,T) batch, all below `vocab`.
fn batch(vocab: u32) -> (Vec<u32>, Vec<u32>) {
    let tokens = (0..B * T).map(|i| (i as u32 * 7 + 3) % vocab).collect();
    let targets = (0..B * T).map(|i| (i as u32 * 11 + 5) % vocab).collect();
    (tokens, targets)
}

/// Largest |got - want| over the largest |want| (absolute when `want` is all zeros).
fn relative_error(got: &[f32], want: &[f32]) -> f32 {
    let scale = want.iter().fold(0f32, |m, w| m.max(w.abs())).max(1e-6);
    let diff = got
        .iter()
        .zip(want)
        .fold(0f32, |m, (g, w)| m.max((g - w).abs()));
    diff / scale
}

#[test]
fn the_model_on_the_gpu_matches_the_cpu_model() {
    let Some(backend) = gpu() else { return };
    let config = GptConfig::tiny();
    let (tokens, targets) = batch(config.vocab_size as u32);
    let cpu = Gpt::new(config).expect("cpu model");
    let params = init_params(cpu.config(), cpu.layout(), 5);
    let lens = cpu.layout().unit_lens();
    let model = Gpt::with_backend(config, backend).expect("gpu model");
    let stream = model.backend().stream().clone();
    for every in [None, Some(1)] {
        let mut want_grads: Vec<Vec<f32>> = lens.iter().map(|&n| vec![0.0; n]).collect();
        let mut cpu_acts = cpu.activations_checkpointed(B, T, every).expect("acts");
        let want = cpu
            .forward_backward(&mut cpu_acts, &params, &mut want_grads, &tokens, &targets)
            .expect("cpu step");

        let dev_params: Vec<CudaSlice<f32>> = params
            .iter()
            .map(|p| stream.clone_htod(p).expect("upload"))
            .collect();
        let mut dev_grads: Vec<CudaSlice<f32>> = lens
            .iter()
            .map(|&n| stream.alloc_zeros::<f32>(n).expect("alloc"))
            .collect();
        let mut acts = model
            .activations_checkpointed(B, T, every)
            .expect("device acts");
        let loss = {
            let p: Vec<&DeviceSlice> = dev_params
                .iter()
                .map(|p| DeviceSlice::of(p, &stream))
                .collect();
            let mut g: Vec<&mut DeviceSlice> = dev_grads
                .iter_mut()
                .map(|g| DeviceSlice::of_mut(g, &stream))
                .collect();
            model
                .forward_backward(&mut acts, &p, &mut g, &tokens, &targets)
                .expect("gpu step")
        };
        model.backend().synchronize().expect("kernels ran");
        // The activations provided the kernels' scratch: attention and the reductions
        // allocated nothing of their own.
        assert_eq!(model.backend().scratch_outside_bytes(), 0);
        assert!(
            (loss - want).abs() <= 1e-4 * want.abs(),
            "loss {loss} vs {want}, every {every:?}"
        );
        for (unit, (g, w)) in dev_grads.iter().zip(&want_grads).enumerate() {
            let got = stream.clone_dtoh(g).expect("download");
            let err = relative_error(&got, w);
            assert!(
                err <= 1e-3,
                "unit {unit}: relative error {err}, every {every:?}"
            );
        }
    }
}
