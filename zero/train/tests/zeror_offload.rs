//! ZeRO-R activation offload (`--offload-activations`), run by the engine from the GPT's
//! program: training with the kept block inputs in pinned host memory gives the losses and
//! parameters of training without offload, to the bit; the arena holds the written-out count
//! of bytes (two staging slots instead of the kept inputs), exactly what the plan declares;
//! each segment's fetch is placed one restore ahead; and the trainer's summary shows the
//! arena and host bytes apart.

mod common;
use common::{write_corpus, TempDir};
use zero::{Call, Engine, EngineConfig, ZeroStage};
use zero_gpt::{init_unit, Gpt, GptConfig, Rng};
use zero_train::bridge::{
    activation_arena_bytes, arena_activations, full_params, gpt_engine, kept_inputs, micro_step,
    ActivationPlacement, GptPrograms,
};
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
        partitions: 1,
    }
}

/// Rank `rank`'s (tokens, targets) at step `step`: one sequence.
fn batch(step: usize, rank: usize) -> (Vec<u32>, Vec<u32>) {
    let mut rng = Rng::new((step * 16 + rank) as u64 + 11);
    let seq: Vec<u32> = (0..=T).map(|_| (rng.next_u64() % 64) as u32).collect();
    (seq[..T].to_vec(), seq[1..].to_vec())
}

/// What one rank saw: per-step losses and final parameters as bits, the arena bytes lent to
/// the model's buffers, and the engine's kept inputs: measured (arena, host) and planned.
#[derive(PartialEq, Debug)]
struct Run {
    bits: (Vec<u32>, Vec<u32>),
    lent: u64,
    kept: (u64, u64),
    kept_plan: (u64, u64),
}

fn engine(comm: zero_comm::Communicator, stage: ZeroStage, placed: ActivationPlacement) -> Engine {
    let cfg = config();
    let layout = Gpt::new(cfg).unwrap().layout().clone();
    let engine_config = EngineConfig {
        stage,
        activation_bytes: activation_arena_bytes(&cfg, 1, T, placed).unwrap(),
        kept_inputs: kept_inputs(&cfg, 1, T, placed).unwrap(),
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
                    let lent = engine.arena().stats().allocated as u64 - before;
                    let mut losses = Vec::new();
                    for step in 0..STEPS {
                        let (x, y) = batch(step, engine.rank());
                        let loss = micro_step(&mut engine, &model, &mut acts, &x, &y).unwrap();
                        losses.push(loss.to_bits());
                        engine.step(1e-2).unwrap();
                    }
                    let params = full_params(&mut engine).unwrap();
                    let params = params.iter().flatten().map(|x| x.to_bits()).collect();
                    let plan = engine.memory_plan();
                    Run {
                        bits: (losses, params),
                        lent,
                        kept: engine.kept_input_bytes().unwrap(),
                        kept_plan: (plan.kept_inputs, plan.kept_inputs_host),
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
                                               // L=5: every 1 recomputes segments 0-3, every 2 segments 0..2 and 2..4, every 5 none.
    for (every, kept) in [(1, 4u64), (2, 2), (5, 0)] {
        let slots = kept.min(2);
        let in_arena = train_ranks(1, ZeroStage::Zero3, placement(every, false));
        let offloaded = train_ranks(1, ZeroStage::Zero3, placement(every, true));
        let case = format!("checkpoint every {every}");
        assert_eq!(in_arena.kept, (kept * input, 0), "{case}");
        assert_eq!(offloaded.kept, (slots * input, kept * input), "{case}");
        for (run, offload) in [(&in_arena, false), (&offloaded, true)] {
            assert_eq!(run.kept_plan, run.kept, "{case}, offload {offload}: plan");
            let plan = activation_arena_bytes(&cfg, 1, T, placement(every, offload)).unwrap();
            assert_eq!(run.lent, plan, "{case}, offload {offload}: lent vs plan");
        }
        assert_eq!(
            in_arena.lent, offloaded.lent,
            "{case}: the model's own buffers"
        );
    }
}

#[test]
fn each_segment_is_fetched_one_restore_ahead() {
    let layout = Gpt::new(config()).unwrap().layout().clone();
    let train = GptPrograms::new(&layout, Some(1)).unwrap().train;
    let kept: Vec<Call> = train
        .schedule()
        .calls()
        .iter()
        .copied()
        .filter(|c| c.unit().is_none())
        .collect();
    // Forward keeps the inputs of blocks 0-3 (block 4's segment is never recomputed); the
    // first restore (3) is fetched right after its keep, each later one after the restore
    // before it.
    let mut want: Vec<Call> = (0..4)
        .flat_map(|k| [Call::BeginKeep(k), Call::EndKeep(k)])
        .collect();
    for k in (0..4).rev() {
        want.extend([Call::Fetch(k), Call::BeginRestore(k), Call::EndRestore(k)]);
    }
    assert_eq!(kept, want);
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
            layers: Some(4),
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
                             // 4 layers checkpointed every block: segments 0-2 are recomputed, so 3 inputs are kept.
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
