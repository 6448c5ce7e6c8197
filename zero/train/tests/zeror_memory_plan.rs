//! Every byte a rank uses comes from its arena: the activations too. The start-up plan (the
//! engine's plan plus the model's activation formula) bounds the measured peak, a cap at the
//! plan trains, and a cap below it is refused at start-up naming what would fit.

use zero::{Engine, EngineConfig, Precision, ZeroStage};
use zero_gpt::{activation_bytes, init_unit, Gpt, GptConfig, Rng};
use zero_train::bridge::{
    activation_arena_bytes, arena_activations, gpt_units, micro_step, ActivationPlacement,
};
use zero_train::memory_fit::{default_shape, MemoryQuery};

const T: usize = 16;
const B: usize = 2;

/// L=3, NH=2, C=64, V=500 (padded to 512).
fn config() -> GptConfig {
    GptConfig::new(T, 500, 3, 2, 64).unwrap()
}

struct Measured {
    plan: u64,
    peak: u64,
    activations: u64,
}

/// Two training steps at `stage` over `world` ranks, activations in the arena; rank 0's
/// plan and peak.
fn run(world: usize, stage: ZeroStage, every: Option<usize>, limit: Option<u64>) -> Measured {
    run_placed(world, stage, placed(every, false), limit)
}

fn placed(checkpoint_every: Option<usize>, offload: bool) -> ActivationPlacement {
    ActivationPlacement {
        checkpoint_every,
        offload,
    }
}

fn run_placed(
    world: usize,
    stage: ZeroStage,
    placement: ActivationPlacement,
    limit: Option<u64>,
) -> Measured {
    let cfg = config();
    let engine_config = EngineConfig {
        stage,
        memory_limit: limit,
        activation_bytes: activation_arena_bytes(&cfg, B, T, placement).unwrap(),
        ..EngineConfig::default()
    };
    let comms = zero_comm::local::create(world).unwrap();
    let mut all: Vec<Measured> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|comm| {
                s.spawn(move || {
                    let model = Gpt::new(cfg).unwrap();
                    let layout = model.layout().clone();
                    let mut engine =
                        Engine::new(comm, gpt_units(&layout), engine_config, |unit, w| {
                            init_unit(&cfg, &layout, unit, 1, w).unwrap()
                        })
                        .unwrap();
                    let mut acts = arena_activations(&mut engine, &model, B, T, placement).unwrap();
                    let mut rng = Rng::new(engine.rank() as u64);
                    for _ in 0..2 {
                        let seq: Vec<u32> =
                            (0..=B * T).map(|_| (rng.next_u64() % 500) as u32).collect();
                        micro_step(&mut engine, &model, &mut acts, &seq[..B * T], &seq[1..])
                            .unwrap();
                        engine.step(1e-3).unwrap();
                    }
                    Measured {
                        plan: engine.memory_plan().total(),
                        peak: engine.arena().stats().peak_allocated as u64,
                        activations: acts.bytes(),
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    all.swap_remove(0)
}

#[test]
fn the_plan_bounds_the_peak_which_holds_the_activations() {
    let cfg = config();
    for world in [1, 2, 4] {
        for stage in ZeroStage::ALL {
            for every in [None, Some(1)] {
                let m = run(world, stage, every, None);
                let what = format!("{stage}, N={world}, checkpointing {every:?}");
                assert_eq!(m.activations, activation_bytes(&cfg, B, T, every).unwrap());
                assert!(
                    m.peak <= m.plan,
                    "{what}: peak {} > plan {}",
                    m.peak,
                    m.plan
                );
                eprintln!(
                    "{what}: plan {} peak {} ({:.2}%)",
                    m.plan,
                    m.peak,
                    100.0 * (m.plan - m.peak) as f64 / m.peak as f64
                );
            }
        }
    }
}

#[test]
fn a_cap_at_the_plan_trains_and_a_cap_below_names_what_fits() {
    let cfg = config();
    let planned = run(2, ZeroStage::Zero3, None, None).plan;
    let capped = run(2, ZeroStage::Zero3, None, Some(planned));
    assert!(capped.peak <= planned);
    let query = MemoryQuery {
        model: cfg,
        micro_batch: B,
        seq_len: T,
        placement: placed(None, false),
        shape: default_shape(2, ZeroStage::Zero0, Precision::Fp32),
    };
    let plan = |stage, every| query.with(stage, every).plan().unwrap().total();
    // The leanest checkpointed option, below every option without checkpointing: only
    // checkpointing makes it fit, at the first stage whose plan is that low.
    let leanest = |every| {
        ZeroStage::ALL
            .map(|s| plan(s, every))
            .into_iter()
            .min()
            .unwrap()
    };
    let with_ckpt = leanest(Some(1));
    assert!(with_ckpt < leanest(None));
    let stage = ZeroStage::ALL
        .into_iter()
        .find(|&s| plan(s, Some(1)) == with_ckpt)
        .unwrap();
    assert_eq!(
        query.what_fits(with_ckpt),
        format!("{stage} with --activation-checkpointing fits ({with_ckpt} bytes)")
    );
    assert!(query.what_fits(with_ckpt - 1).contains("nothing fits"));
    // The engine refuses a cap below its plan before allocating anything.
    let engine_config = EngineConfig {
        stage: ZeroStage::Zero3,
        memory_limit: Some(with_ckpt - 1),
        activation_bytes: activation_arena_bytes(&cfg, B, T, placed(Some(1), false)).unwrap(),
        ..EngineConfig::default()
    };
    let comm = zero_comm::local::create(1).unwrap().pop().unwrap();
    let layout = Gpt::new(cfg).unwrap().layout().clone();
    let err = Engine::new(comm, gpt_units(&layout), engine_config, |_, _| {}).unwrap_err();
    assert!(matches!(err, zero::Error::DoesNotFit { .. }), "{err}");
}

#[test]
fn offloaded_inputs_leave_the_arena_and_the_plan_by_their_bytes() {
    let cfg = config();
    for stage in [ZeroStage::Zero0, ZeroStage::Zero3] {
        let kept = run_placed(2, stage, placed(Some(1), false), None);
        let offloaded = run_placed(2, stage, placed(Some(1), true), None);
        // L=3 kept inputs of (B*T, C) floats, 256-byte aligned already.
        let inputs = 3 * (B * T * cfg.channels) as u64 * 4;
        assert_eq!(kept.plan - offloaded.plan, inputs, "{stage}");
        assert!(offloaded.peak <= offloaded.plan, "{stage}");
        assert_eq!(
            offloaded.activations, kept.activations,
            "the model holds the same"
        );
    }
}
