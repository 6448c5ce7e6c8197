//! ZeRO stages on one GPU (feature `cuda`): N_d = 1, 2 and 4 ranks as threads sharing GPU 0,
//! the tiny GPT on `CudaBackend`, the engine's states in CUDA arenas, device-local
//! collectives, in fp32, bf16 and fp16. Every stage gives stage 0's losses and parameters to
//! the bit, and the run follows the CPU run of the same configuration within the kernels'
//! stated tolerances; so do the optimizer offloaded to the host arena or to its file.
//!
//! Without a driver it prints why it skips and passes, unless `ZERO_GPT_REQUIRE_GPU=1`
//! (`scripts/gpu-check.sh run` sets it). Not yet run on a GPU.

use zero::{EngineConfig, EngineOps, Precision, ZeroStage};
use zero_gpt::{init_unit, Gpt, GptConfig, Rng};
use zero_train::bridge::{gpt_engine_on, micro_step, Placement};

const T: usize = 16;
const STEPS: usize = 3;
const ROWS: usize = 8;

#[derive(Debug, Clone, PartialEq)]
struct Run {
    losses: Vec<f32>,
    params: Vec<Vec<f32>>,
}

/// The tokens and targets of step `step` (all ranks' rows).
fn batch(step: usize, vocab: u32) -> (Vec<u32>, Vec<u32>) {
    let mut rng = Rng::new(500 + step as u64);
    let seq: Vec<u32> = (0..ROWS * T + 1)
        .map(|_| (rng.next_u64() % u64::from(vocab)) as u32)
        .collect();
    (seq[..ROWS * T].to_vec(), seq[1..].to_vec())
}

/// One rank's run: `STEPS` steps of its rows of every batch; rank 0's result is kept.
fn rank_run<B: Placement>(
    comm: zero_comm::Communicator,
    model: Gpt<B>,
    ops: EngineOps,
    config: EngineConfig,
) -> Run {
    let gcfg = *model.config();
    let layout = model.layout().clone();
    let init = |unit: usize, w: &mut [f32]| init_unit(&gcfg, &layout, unit, 11, w).unwrap();
    let mut engine = gpt_engine_on(comm, &layout, None, config, ops, init).unwrap();
    let (rank, world) = (engine.rank(), engine.world());
    let rows = ROWS / world;
    let mut acts = model.activations(rows, T).unwrap();
    let mut losses = vec![];
    for step in 0..STEPS {
        let (x, y) = batch(step, gcfg.vocab_size as u32);
        let at = rank * rows * T..(rank + 1) * rows * T;
        let loss = micro_step(&mut engine, &model, &mut acts, &x[at.clone()], &y[at]).unwrap();
        engine.step(1e-2).unwrap();
        losses.push(loss);
    }
    let params = (0..engine.units().len())
        .map(|u| engine.with_whole_params(u, <[f32]>::to_vec).unwrap())
        .collect();
    Run { losses, params }
}

fn config(stage: ZeroStage, precision: Precision) -> EngineConfig {
    EngineConfig {
        stage,
        precision,
        reduce_bucket_bytes: 4096,
        ..EngineConfig::default()
    }
}

fn cpu_run(world: usize, config: EngineConfig) -> Run {
    let comms = zero_comm::local::create(world).unwrap();
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|comm| {
                s.spawn(move || {
                    let model = Gpt::new(GptConfig::tiny()).unwrap();
                    rank_run(comm, model, EngineOps::host(), config)
                })
            })
            .collect();
        let mut runs: Vec<Run> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        runs.swap_remove(0)
    })
}

fn gpu_run(world: usize, config: EngineConfig) -> Option<Run> {
    gpu_run_with_files(world, config, None)
}

/// As [`gpu_run`], the ranks' files of the nvme tier in `nvme` when given.
fn gpu_run_with_files(
    world: usize,
    config: EngineConfig,
    nvme: Option<&std::path::Path>,
) -> Option<Run> {
    use zero_train::run::device::cuda::{gemm_math, ranks};
    let math = gemm_math(config.precision);
    let devices = match ranks(0, world, zero_comm::Config::default(), math) {
        Ok(devices) => devices,
        Err(e) if std::env::var("ZERO_GPT_REQUIRE_GPU").as_deref() != Ok("1") => {
            eprintln!("cuda_stages: skipped: {e}");
            return None;
        }
        Err(e) => panic!("a GPU was required: {e}"),
    };
    let comms = zero_comm::local::create(world).unwrap();
    let runs: Vec<Run> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .zip(devices)
            .map(|(comm, device)| {
                s.spawn(move || {
                    let (backend, ops) = device.into_parts().unwrap();
                    let ops = ops.with_nvme_path(nvme.map(std::path::Path::to_path_buf));
                    let model = Gpt::with_backend(GptConfig::tiny(), backend).unwrap();
                    rank_run(comm, model, ops, config)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    runs.into_iter().next()
}

fn bits(run: &Run) -> Vec<u32> {
    let losses = run.losses.iter().map(|x| x.to_bits());
    losses
        .chain(run.params.iter().flatten().map(|x| x.to_bits()))
        .collect()
}

/// How `gpu` follows `cpu`: the largest loss difference, and the fraction of parameters
/// further than `tolerance` and the largest parameter difference, each |a - b| / (1 + |b|).
fn follows(gpu: &Run, cpu: &Run, tolerance: f32) -> (f32, f64, f32) {
    let rel = |(x, y): (&f32, &f32)| (x - y).abs() / (1.0 + y.abs());
    let loss = gpu
        .losses
        .iter()
        .zip(&cpu.losses)
        .map(rel)
        .fold(0.0, f32::max);
    let params = gpu.params.iter().flatten().zip(cpu.params.iter().flatten());
    let (mut beyond, mut total, mut worst) = (0usize, 0usize, 0f32);
    for d in params.map(rel) {
        beyond += usize::from(d > tolerance);
        total += 1;
        worst = worst.max(d);
    }
    (loss, beyond as f64 / total.max(1) as f64, worst)
}

/// The GPU-vs-CPU tolerance of a precision. cuBLAS sums in another order than the CPU matmul
/// (docs/gpu.md); at bf16 the products round their inputs to bf16 on tensor cores, at fp16 to
/// TF32 (the trainer's `gemm_math`).
fn tolerance(precision: Precision) -> f32 {
    match precision {
        Precision::Fp32 => 2e-3,
        Precision::Bf16 | Precision::Fp16 => 3e-2,
    }
}

#[test]
fn stages_on_one_gpu_give_the_same_bits_and_follow_the_cpu() {
    for precision in [Precision::Fp32, Precision::Bf16, Precision::Fp16] {
        for world in [1, 2, 4] {
            let Some(reference) = gpu_run(world, config(ZeroStage::Zero0, precision)) else {
                return;
            };
            let what = format!("{precision:?} N_d={world}");
            let cpu = cpu_run(world, config(ZeroStage::Zero0, precision));
            // Losses follow the CPU within the tolerance. Parameters are not held element by
            // element: AdamW's first steps move each parameter by about lr whatever its
            // gradient's size, so a gradient within rounding of zero can take the other sign
            // on the GPU and move that one parameter 2 lr away. Such parameters are rare; a
            // wrong kernel or a wrong wiring moves far more than 1% of them.
            let tol = tolerance(precision);
            let (loss, beyond, worst) = follows(&reference, &cpu, tol);
            assert!(loss < tol, "{what}: GPU vs CPU losses differ by {loss}");
            assert!(
                beyond <= 0.01,
                "{what}: {:.2}% of the parameters differ from the CPU's by more than {tol}",
                100.0 * beyond
            );
            for stage in [ZeroStage::Zero1, ZeroStage::Zero2, ZeroStage::Zero3] {
                let run = gpu_run(world, config(stage, precision)).unwrap();
                assert!(bits(&run) == bits(&reference), "{what}: {stage} vs stage 0");
            }
            eprintln!(
                "cuda_stages: {what}: stages 0-3 equal to the bit; GPU vs CPU: losses {loss:.2e}, \
                 parameters beyond {tol}: {:.3}%, largest {worst:.2e}",
                100.0 * beyond
            );
        }
    }
}

/// ZeRO-Offload on the GPU: the host AdamW over the page-locked host arena gives the bits of
/// the device AdamW (the engine's kernels are bitwise equal to the host's,
/// `kernels_cuda.rs`), so offloaded runs equal stage 0 on the GPU to the bit; at stage 3
/// also with the parameter shards in their registered host arena (`--offload-params cpu`),
/// copied up into each gather's buffer.
#[test]
fn offloaded_optimizer_on_the_gpu_gives_the_same_bits() {
    for precision in [Precision::Fp32, Precision::Bf16, Precision::Fp16] {
        let Some(reference) = gpu_run(2, config(ZeroStage::Zero0, precision)) else {
            return;
        };
        for (stage, params) in [
            (ZeroStage::Zero0, false),
            (ZeroStage::Zero3, false),
            (ZeroStage::Zero3, true),
        ] {
            let offloaded = EngineConfig {
                offload_optimizer: true,
                offload_params: params,
                ..config(stage, precision)
            };
            let run = gpu_run(2, offloaded).unwrap();
            let what =
                format!("{precision:?} {stage} offloaded (parameters {params}) vs stage 0, N_d=2");
            assert!(bits(&run) == bits(&reference), "{what}");
        }
        eprintln!("cuda_stages: {precision:?}: offloaded optimizer equal to the bit");
    }
}

/// ZeRO-Offload's gradients on the GPU (`--offload-gradients`): each landed bucket's
/// segment is copied down into a landing block of the registered host arena and added
/// there by the host's element loop, and the step's norm, update and zeroing read the host
/// blocks (the host kernels equal the device's to the bit, `kernels_cuda.rs`), so the runs
/// equal stage 0 on the GPU to the bit; beside the delayed update (the gradients then in a
/// host arena of their own) they equal the delayed update with the gradients on the device.
#[test]
fn offloaded_gradients_on_the_gpu_give_the_same_bits() {
    for precision in [Precision::Fp32, Precision::Bf16] {
        let Some(reference) = gpu_run(2, config(ZeroStage::Zero0, precision)) else {
            return;
        };
        for stage in [ZeroStage::Zero0, ZeroStage::Zero2, ZeroStage::Zero3] {
            let offloaded = EngineConfig {
                offload_optimizer: true,
                offload_gradients: true,
                ..config(stage, precision)
            };
            let run = gpu_run(2, offloaded).unwrap();
            let what = format!("{precision:?} {stage} gradients offloaded vs stage 0, N_d=2");
            assert!(bits(&run) == bits(&reference), "{what}");
        }
        let delayed = EngineConfig {
            offload_optimizer: true,
            delayed_param_update: true,
            ..config(ZeroStage::Zero2, precision)
        };
        let on_device = gpu_run(2, delayed).unwrap();
        let grads = EngineConfig {
            offload_gradients: true,
            ..delayed
        };
        let run = gpu_run(2, grads).unwrap();
        let what = format!("{precision:?} delayed update: gradients on the host vs the device");
        assert!(bits(&run) == bits(&on_device), "{what}");
        eprintln!("cuda_stages: {precision:?}: offloaded gradients equal to the bit");
    }
}

/// ZeRO-Infinity's files on the GPU (`--offload-optimizer nvme`, and at stage 3
/// `--offload-params nvme`): the states stream from one file per rank through the
/// page-locked host arena and the host AdamW, the parameter shards from their file through
/// the reads ahead's host arena, so the runs equal stage 0 on the GPU to the bit; and the
/// delayed parameter update beside the file gives the bits of the delayed update beside
/// the host arena.
#[test]
fn the_optimizer_file_on_the_gpu_gives_the_same_bits() {
    let dir = std::env::temp_dir().join(format!("cuda-stages-nvme-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for precision in [Precision::Fp32, Precision::Bf16] {
        let Some(reference) = gpu_run(2, config(ZeroStage::Zero0, precision)) else {
            std::fs::remove_dir(&dir).unwrap();
            return;
        };
        for (stage, params, budget) in tiers_on_files() {
            let filed = EngineConfig {
                offload_optimizer: true,
                optimizer_file: true,
                offload_params: params,
                params_file: params,
                nvme_prefetch_bytes: budget,
                ..config(stage, precision)
            };
            let run = gpu_run_with_files(2, filed, Some(&dir)).unwrap();
            let what = format!(
                "{precision:?} {stage} optimizer file, parameter file {params} (reads ahead \
                 within {budget} bytes) vs stage 0, N_d=2"
            );
            assert!(bits(&run) == bits(&reference), "{what}");
        }
    }
    let delayed = EngineConfig {
        offload_optimizer: true,
        delayed_param_update: true,
        ..config(ZeroStage::Zero2, Precision::Fp32)
    };
    let host = gpu_run(2, delayed).unwrap();
    let filed = EngineConfig {
        optimizer_file: true,
        ..delayed
    };
    let run = gpu_run_with_files(2, filed, Some(&dir)).unwrap();
    assert!(
        bits(&run) == bits(&host),
        "delayed update: file vs host arena"
    );
    std::fs::remove_dir_all(&dir).unwrap();
    eprintln!("cuda_stages: optimizer and parameter files equal to the bit (fp32, bf16, delayed)");
}

/// The stages and parameter tiers the file test runs beside the optimizer's file: (stage,
/// parameters in their file, reads-ahead budget); a budget of one byte holds one shard at a
/// time, so each gather waits for a read sent one fetch before it.
fn tiers_on_files() -> [(ZeroStage, bool, usize); 4] {
    let default = zero::DEFAULT_NVME_PREFETCH_BYTES;
    [
        (ZeroStage::Zero0, false, default),
        (ZeroStage::Zero3, false, default),
        (ZeroStage::Zero3, true, default),
        (ZeroStage::Zero3, true, 1),
    ]
}
