//! ZeRO-R activation offload on one GPU (feature `cuda`): N_d = 1 and 2 ranks as threads
//! sharing GPU 0, stage 3, the small GPT on `CudaBackend` with activation checkpointing, its
//! kept block inputs held by the engine in the arena or offloaded to pinned host memory
//! through zero-alloc's copy engine. Offload changes no bit of the losses or the final
//! parameters; the arena lends the model exactly what the plan (`activation_arena_bytes`)
//! declares, and the host holds one (N,C) input per recomputed segment.
//!
//! Without a driver it prints why it skips and passes, unless `ZERO_GPT_REQUIRE_GPU=1`
//! (`scripts/gpu-check.sh run` sets it). Not yet run on a GPU.

use zero::{EngineConfig, EngineOps, ZeroStage};
use zero_gpt::cuda::CudaBackend;
use zero_gpt::{init_unit, Gpt, GptConfig, Rng};
use zero_train::bridge::{
    activation_arena_bytes, arena_activations, gpt_engine_on, kept_inputs, micro_step,
    ActivationPlacement, Placement,
};
use zero_train::run::device::cuda::{ranks, CudaRank};

const T: usize = 8;
const ROWS: usize = 2;
const STEPS: usize = 3;
const VOCAB: u32 = 64;

/// L=5 (segments of 2 blocks leave a short last one), NH=2, C=32, V=64.
fn config() -> GptConfig {
    GptConfig::new(T, VOCAB as usize, 5, 2, 32).unwrap()
}

fn placement(every: usize, offload: bool) -> ActivationPlacement {
    ActivationPlacement {
        checkpoint_every: Some(every),
        offload,
        backend_scratch: 0, // set per rank by `rank_run`
        partitions: 1,
    }
}

/// The tokens and targets of step `step` (all ranks' rows).
fn batch(step: usize) -> (Vec<u32>, Vec<u32>) {
    let mut rng = Rng::new(900 + step as u64);
    let seq: Vec<u32> = (0..=ROWS * T)
        .map(|_| (rng.next_u64() % u64::from(VOCAB)) as u32)
        .collect();
    (seq[..ROWS * T].to_vec(), seq[1..].to_vec())
}

/// What rank 0 saw: losses and final parameters as bits, the arena bytes lent to the
/// model's buffers, and the engine's kept inputs (arena, host).
#[derive(Debug, PartialEq)]
struct Run {
    bits: (Vec<u32>, Vec<u32>),
    arena_taken: u64,
    kept: (u64, u64),
}

fn rank_run<B: Placement>(
    comm: zero_comm::Communicator,
    model: &Gpt<B>,
    ops: EngineOps,
    placed: ActivationPlacement,
) -> Run {
    let cfg = *model.config();
    let layout = model.layout().clone();
    let world = comm.size();
    let rows = ROWS / world;
    let placed = placed
        .with_scratch_of(model.backend(), &cfg, rows, T)
        .unwrap();
    let config = EngineConfig {
        stage: ZeroStage::Zero3,
        activation_bytes: activation_arena_bytes(&cfg, rows, T, placed).unwrap(),
        kept_inputs: kept_inputs(&cfg, rows, T, placed).unwrap(),
        reduce_bucket_bytes: 4096,
        ..EngineConfig::default()
    };
    let init = |unit: usize, w: &mut [f32]| init_unit(&cfg, &layout, unit, 5, w).unwrap();
    let mut engine =
        gpt_engine_on(comm, &layout, placed.checkpoint_every, config, ops, init).unwrap();
    let rank = engine.rank();
    let before = engine.arena().stats().allocated as u64;
    let mut acts = arena_activations(&mut engine, model, rows, T, placed).unwrap();
    let arena_taken = engine.arena().stats().allocated as u64 - before;
    let mut losses = Vec::new();
    for step in 0..STEPS {
        let (x, y) = batch(step);
        let at = rank * rows * T..(rank + 1) * rows * T;
        let loss = micro_step(&mut engine, model, &mut acts, &x[at.clone()], &y[at]).unwrap();
        engine.step(1e-2).unwrap();
        losses.push(loss.to_bits());
    }
    // Read through the arena's byte copies (a CUDA arena has no host view).
    let params = (0..engine.units().len())
        .flat_map(|u| engine.with_whole_params(u, <[f32]>::to_vec).unwrap())
        .map(f32::to_bits)
        .collect();
    Run {
        bits: (losses, params),
        arena_taken,
        kept: engine.kept_input_bytes().unwrap(),
    }
}

/// `world` rank threads on GPU 0; rank 0's [`Run`], or `None` (skipped) without a GPU.
fn gpu_run(world: usize, placed: ActivationPlacement) -> Option<Run> {
    let math = zero_gpt::cuda::GemmMath::Exact; // the model in f32 here
    let devices: Vec<CudaRank> = match ranks(0, world, zero_comm::Config::default(), math) {
        Ok(devices) => devices,
        Err(e) if std::env::var("ZERO_GPT_REQUIRE_GPU").as_deref() != Ok("1") => {
            eprintln!("cuda_offload: skipped: {e}");
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
                    let model = Gpt::with_backend(config(), backend).unwrap();
                    rank_run(comm, &model, ops, placed)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    runs.into_iter().next()
}

#[test]
fn offload_on_the_gpu_changes_no_bit_and_lends_what_the_plan_says() {
    let cfg = config();
    for world in [1, 2] {
        let input = (ROWS / world * T * cfg.channels * 4) as u64; // one (N,C) input
                                                                  // L=5: every 1 recomputes (and keeps) 4 segments, every 2 keeps 2.
        for (every, kept_inputs) in [(1, 4u64), (2, 2)] {
            let what = format!("N_d={world}, checkpoint every {every}");
            let Some(kept) = gpu_run(world, placement(every, false)) else {
                return;
            };
            assert_ne!(
                kept.bits.0[0],
                kept.bits.0[STEPS - 1],
                "{what}: no training"
            );
            let offloaded = gpu_run(world, placement(every, true)).unwrap();
            assert!(
                offloaded.bits == kept.bits,
                "{what}: offload changed the results"
            );
            let slots = kept_inputs.min(2);
            assert_eq!(kept.kept, (kept_inputs * input, 0), "{what}: in the arena");
            let both = (slots * input, kept_inputs * input);
            assert_eq!(offloaded.kept, both, "{what}: offloaded");
            for (run, offload) in [(&kept, false), (&offloaded, true)] {
                let rows = ROWS / world;
                let placed = ActivationPlacement {
                    backend_scratch: CudaBackend::scratch_elements(
                        rows,
                        T,
                        cfg.channels,
                        cfg.num_heads,
                    )
                    .unwrap(),
                    ..placement(every, offload)
                };
                let plan = activation_arena_bytes(&cfg, rows, T, placed);
                assert_eq!(run.arena_taken, plan.unwrap(), "{what}, offload {offload}");
            }
            assert_eq!(
                kept.arena_taken, offloaded.arena_taken,
                "{what}: the model's buffers"
            );
            let saved = (kept_inputs - slots) * input;
            eprintln!("cuda_offload: {what}: equal to the bit; {saved} arena bytes saved");
        }
    }
}
