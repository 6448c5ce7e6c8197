//! ZeRO-R activation offload (`--offload-activations`): training with the kept block inputs in
//! pinned host memory gives the losses and parameters of training without offload, to the bit;
//! the arena holds the written-out count of bytes (the staging slots instead of the kept
//! inputs), exactly what the plan declares; each segment's fetch is queued before the model
//! asks for it; and the trainer's summary shows the arena and host bytes apart.

mod common;
use common::{write_corpus, TempDir};
use std::sync::{Arc, Mutex};
use zero::{Engine, EngineConfig, ZeroStage};
use zero_gpt::{init_unit, Activations, Buffer, Gpt, GptConfig, Rng};
use zero_train::bridge::{
    activation_arena_bytes, arena_activations, full_params, gpt_engine, micro_step,
    ActivationPlacement, StepError,
};
use zero_train::offload::{offloaded_inputs, OffloadEvent};
use zero_train::{train, TrainConfig};

const T: usize = 8;
const STEPS: usize = 3;

/// L=5 (segments of 2 blocks leave a short last one), NH=2, C=32, V=64. One (N,C) input is
/// 8 x 32 floats = 1024 bytes, a whole number of the arena's 256-byte alignment.
fn config() -> GptConfig {
    GptConfig::new(T, 64, 5, 2, 32).unwrap()
}

fn placement(every: usize, offload: bool) -> ActivationPlacement {
    ActivationPlacement {
        checkpoint_every: Some(every),
        offload,
        backend_scratch: 0, // the CPU backend's
    }
}

/// Rank `rank`'s (tokens, targets) at step `step`: one sequence.
fn batch(step: usize, rank: usize) -> (Vec<u32>, Vec<u32>) {
    let mut rng = Rng::new((step * 16 + rank) as u64 + 11);
    let seq: Vec<u32> = (0..=T).map(|_| (rng.next_u64() % 64) as u32).collect();
    (seq[..T].to_vec(), seq[1..].to_vec())
}

/// What one rank saw: per-step losses and final parameters as bits, and the arena bytes the
/// activations took, as measured, as [`Activations::bytes`] says, and offloaded.
#[derive(PartialEq, Debug)]
struct Run {
    bits: (Vec<u32>, Vec<u32>),
    arena_taken: u64,
    acts_bytes: u64,
    offloaded: u64,
}

fn engine(comm: zero_comm::Communicator, stage: ZeroStage, placed: ActivationPlacement) -> Engine {
    let cfg = config();
    let layout = Gpt::new(cfg).unwrap().layout().clone();
    let engine_config = EngineConfig {
        stage,
        activation_bytes: activation_arena_bytes(&cfg, 1, T, placed).unwrap(),
        ..EngineConfig::default()
    };
    gpt_engine(
        comm,
        &layout,
        placed.checkpoint_every,
        engine_config,
        |unit, w| init_unit(&cfg, &layout, unit, 3, w).unwrap(),
    )
    .unwrap()
}

/// Trains STEPS steps on `world` ranks; returns rank 0's [`Run`].
fn train_ranks(world: usize, stage: ZeroStage, placed: ActivationPlacement) -> Run {
    let comms = zero_comm::local::create(world).unwrap();
    let mut runs: Vec<Run> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|comm| {
                s.spawn(move || {
                    let model = Gpt::new(config()).unwrap();
                    let mut engine = engine(comm, stage, placed);
                    let before = engine.arena().stats().allocated as u64;
                    let mut acts = arena_activations(&mut engine, &model, 1, T, placed).unwrap();
                    let arena_taken = engine.arena().stats().allocated as u64 - before;
                    let mut losses = Vec::new();
                    for step in 0..STEPS {
                        let (x, y) = batch(step, engine.rank());
                        let loss = micro_step(&mut engine, &model, &mut acts, &x, &y).unwrap();
                        losses.push(loss.to_bits());
                        engine.step(1e-2).unwrap();
                    }
                    let params = full_params(&mut engine).unwrap();
                    let params = params.iter().flatten().map(|x| x.to_bits()).collect();
                    Run {
                        bits: (losses, params),
                        arena_taken,
                        acts_bytes: acts.bytes(),
                        offloaded: acts.offloaded_bytes(),
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    runs.swap_remove(0)
}

#[test]
fn offload_changes_no_bit_at_stages_0_and_3() {
    for world in [1, 2] {
        for stage in [ZeroStage::Zero0, ZeroStage::Zero3] {
            for every in [1, 2] {
                let kept = train_ranks(world, stage, placement(every, false));
                assert_ne!(
                    kept.bits.0[0],
                    kept.bits.0[STEPS - 1],
                    "training moved nothing"
                );
                let offloaded = train_ranks(world, stage, placement(every, true));
                assert!(
                    offloaded.bits == kept.bits,
                    "{stage}, N={world}, checkpoint every {every}: results differ"
                );
            }
        }
    }
}

#[test]
fn the_arena_holds_two_slots_instead_of_the_kept_inputs_and_the_plan_says_so() {
    let cfg = config();
    let input = (T * cfg.channels * 4) as u64; // one (N,C) input, 1024 bytes
    for (every, segments) in [(1, 5u64), (2, 3), (5, 1)] {
        let slots = segments.min(2);
        let kept = train_ranks(1, ZeroStage::Zero3, placement(every, false));
        let offloaded = train_ranks(1, ZeroStage::Zero3, placement(every, true));
        let case = format!("checkpoint every {every}");
        assert_eq!(
            kept.acts_bytes - offloaded.acts_bytes,
            (segments - slots) * input,
            "{case}"
        );
        assert_eq!(offloaded.offloaded, segments * input, "{case}");
        assert_eq!(kept.offloaded, 0, "{case}");
        for (run, offload) in [(&kept, false), (&offloaded, true)] {
            let plan = activation_arena_bytes(&cfg, 1, T, placement(every, offload)).unwrap();
            assert_eq!(
                run.arena_taken, plan,
                "{case}, offload {offload}: lent vs plan"
            );
        }
        let plan_kept = activation_arena_bytes(&cfg, 1, T, placement(every, false)).unwrap();
        assert_eq!(
            plan_kept - offloaded.arena_taken,
            (segments - slots) * input,
            "{case}"
        );
    }
}

#[test]
fn each_segment_is_fetched_before_it_is_restored() {
    let cfg = config();
    let model = Gpt::new(cfg).unwrap();
    let comm = zero_comm::local::create(1).unwrap().remove(0);
    let mut engine = engine(comm, ZeroStage::Zero3, placement(1, true));
    let log = Arc::new(Mutex::new(Vec::new()));
    let kept = offloaded_inputs(&mut engine, 5, T * cfg.channels)
        .unwrap()
        .with_event_log(Arc::clone(&log));
    let alloc = |_, len| -> Result<Buffer, StepError> { Ok(Box::new(vec![0f32; len])) };
    let mut acts =
        Activations::with_kept_inputs(&cfg, 1, T, Some(1), alloc, Box::new(kept)).unwrap();
    // Forward queues the copies out of 0..5 and, at the last segment, the fetch of 3 (4 is
    // still in place); each restore of s+1 is followed by the fetch of s, queued before the
    // recompute and backward of segment s+1 run, and s's restore finds it queued.
    let mut expected: Vec<OffloadEvent> = (0..5).map(OffloadEvent::KeepQueued).collect();
    expected.push(OffloadEvent::FetchQueued(3));
    for s in (0..4).rev() {
        expected.push(OffloadEvent::Restored {
            segment: s,
            fetched_ahead: true,
        });
        if s > 0 {
            expected.push(OffloadEvent::FetchQueued(s - 1));
        }
    }
    for step in 0..2 {
        let (x, y) = batch(step, 0);
        micro_step(&mut engine, &model, &mut acts, &x, &y).unwrap();
        engine.step(1e-2).unwrap();
        let events = std::mem::take(&mut *log.lock().unwrap());
        assert_eq!(events, expected, "step {step}");
    }
}

#[test]
fn the_summary_shows_arena_and_host_activation_bytes_apart() {
    let dir = TempDir::new("offload-summary");
    let mut rng = Rng::new(4);
    let tokens: Vec<u16> = (0..4_000).map(|_| (rng.next_u64() % 100) as u16).collect();
    write_corpus(&dir.0, &tokens, 1_000, 100);
    let run = |offload| {
        train(&TrainConfig {
            model: "tiny".into(),
            layers: Some(3),
            seq_len: 16,
            data: dir.0.clone(),
            world_size: 1,
            steps: 2,
            batch_size: 1,
            micro_batch_size: 1,
            eval_every: 0,
            sample_tokens: 0,
            activation_checkpointing: true,
            offload_activations: offload,
            ..TrainConfig::default()
        })
        .unwrap()
    };
    let (kept, offloaded) = (run(false), run(true));
    let (a, b) = (&kept.ranks[0], &offloaded.ranks[0]);
    let input = 16 * 32 * 4; // tiny: C = 32; one (N,C) input with B=1, T=16
    assert_eq!(a.activation_offloaded_bytes, 0);
    assert_eq!(b.activation_offloaded_bytes, 3 * input);
    assert_eq!(
        a.activation_bytes - b.activation_bytes,
        input,
        "3 inputs out, 2 slots in"
    );
    let json = b.to_json();
    assert_eq!(json["activation_offloaded_bytes"], 3 * input);
}
