//! Every byte a rank uses comes from its arena: the activations too. The start-up plan (the
//! engine's replay of the declared schedule plus the model's activation formula) is the
//! measured peak to the byte, a cap at the plan trains, a cap below it is refused at start-up
//! naming what would fit, and memory defragmentation is what lets a cap at the plan train.

use zero::{EngineConfig, Precision, ZeroStage};
use zero_alloc::AllocError;
use zero_gpt::{activation_bytes, init_unit, Gpt, GptConfig, Rng};
use zero_train::bridge::{
    activation_arena_bytes, arena_activations, gpt_engine, kept_inputs, micro_step,
    ActivationPlacement, StepError,
};
use zero_train::plan::memory_fit::{default_shape, MemoryQuery};

const T: usize = 16;
const B: usize = 2;
/// One block input, (B*T, C) floats with C = 64, 256-byte aligned already.
const INPUT: u64 = (B * T * 64 * 4) as u64;

/// L=3, NH=2, C=64, V=500 (padded to 512).
fn config() -> GptConfig {
    with_layers(3)
}

fn with_layers(layers: usize) -> GptConfig {
    GptConfig::new(T, 500, layers, 2, 64).unwrap()
}

/// What rank 0 planned and measured: the activations are the model's buffers and the kept
/// inputs the engine holds in the arena; `host` the kept inputs offloaded.
struct Measured {
    plan: u64,
    peak: u64,
    activations: u64,
    host: u64,
    defrags: u64,
}

/// One configuration of a run.
#[derive(Clone, Copy)]
struct Run {
    world: usize,
    stage: ZeroStage,
    precision: Precision,
    placement: ActivationPlacement,
    limit: Option<u64>,
    defragment: bool,
    layers: usize,
}

impl Run {
    fn new(world: usize, stage: ZeroStage, every: Option<usize>) -> Self {
        Self {
            world,
            stage,
            precision: Precision::Fp32,
            placement: placed(every, false),
            limit: None,
            defragment: true,
            layers: 3,
        }
    }

    fn config(&self) -> GptConfig {
        with_layers(self.layers)
    }

    fn engine_config(&self) -> EngineConfig {
        EngineConfig {
            stage: self.stage,
            precision: self.precision,
            memory_limit: self.limit,
            defragment: self.defragment,
            activation_bytes: activation_arena_bytes(&self.config(), B, T, self.placement).unwrap(),
            kept_inputs: kept_inputs(&self.config(), B, T, self.placement).unwrap(),
            ..EngineConfig::default()
        }
    }

    /// Two training steps on every rank, activations in the arena; rank 0's figures, or the
    /// first error.
    fn go(self) -> Result<Measured, StepError> {
        let comms = zero_comm::local::create(self.world).unwrap();
        let mut all: Vec<Result<Measured, StepError>> = std::thread::scope(|s| {
            let handles: Vec<_> = comms
                .into_iter()
                .map(|comm| s.spawn(move || self.on_rank(comm)))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        all.swap_remove(0)
    }

    fn on_rank(self, comm: zero_comm::Communicator) -> Result<Measured, StepError> {
        let cfg = self.config();
        let model = Gpt::new(cfg)?;
        let layout = model.layout().clone();
        let every = self.placement.checkpoint_every;
        let mut engine = gpt_engine(comm, &layout, every, self.engine_config(), |unit, w| {
            init_unit(&cfg, &layout, unit, 1, w).unwrap()
        })?;
        let mut acts = arena_activations(&mut engine, &model, B, T, self.placement)?;
        let mut rng = Rng::new(engine.rank() as u64);
        for _ in 0..2 {
            let seq: Vec<u32> = (0..=B * T).map(|_| (rng.next_u64() % 500) as u32).collect();
            micro_step(&mut engine, &model, &mut acts, &seq[..B * T], &seq[1..])?;
            engine.step(1e-3)?;
        }
        let stats = engine.arena().stats();
        let (kept, host) = engine.kept_input_bytes()?;
        Ok(Measured {
            plan: engine.memory_plan().total(),
            peak: stats.peak_allocated as u64,
            activations: acts.bytes() + kept,
            host,
            defrags: stats.defrags,
        })
    }
}

fn placed(checkpoint_every: Option<usize>, offload: bool) -> ActivationPlacement {
    ActivationPlacement {
        checkpoint_every,
        offload,
        backend_scratch: 0, // the CPU backend's
        partitions: 1,
    }
}

#[test]
fn the_plan_is_the_peak_for_every_stage_and_option() {
    let cfg = config();
    let placements = [
        placed(None, false),
        placed(Some(1), false),
        placed(Some(2), false),
        placed(Some(1), true),
    ];
    for world in [1, 2, 4] {
        for stage in ZeroStage::ALL {
            for precision in [Precision::Fp32, Precision::Bf16] {
                for placement in placements {
                    let run = Run {
                        precision,
                        placement,
                        limit: Some(1 << 30),
                        ..Run::new(world, stage, None)
                    };
                    let m = run.go().unwrap();
                    let what = format!("{stage}, N={world}, {precision:?}, {placement:?}");
                    let every = placement.checkpoint_every;
                    // zero-gpt's formula counts one kept input per segment; the engine keeps
                    // the recomputed ones (all but the last), in the arena or, offloaded,
                    // on the host behind two staging slots (as many as L=3 keeps anyway).
                    let segments = every.map_or(0, |k| 3u64.div_ceil(k as u64));
                    let kept = segments.saturating_sub(1);
                    let model = activation_bytes(&cfg, B, T, every).unwrap();
                    assert_eq!(m.activations, model - (segments - kept) * INPUT, "{what}");
                    let host = if placement.offload { kept * INPUT } else { 0 };
                    assert_eq!(m.host, host, "{what}");
                    assert_eq!(m.peak, m.plan, "{what}");
                }
            }
        }
    }
}

#[test]
fn a_cap_at_the_plan_trains_and_a_cap_below_names_what_fits() {
    let cfg = config();
    let planned = Run::new(2, ZeroStage::Zero3, None).go().unwrap().plan;
    let capped = Run {
        limit: Some(planned),
        ..Run::new(2, ZeroStage::Zero3, None)
    };
    // Blocks in flight can split the free space at a cap this tight: the engine lands them
    // and compacts, so the peak can only fall below the plan.
    assert!(capped.go().unwrap().peak <= planned);
    let query = MemoryQuery {
        model: cfg,
        micro_batch: B,
        seq_len: T,
        placement: placed(None, false),
        shape: default_shape(2, ZeroStage::Zero0, Precision::Fp32),
        tensor_parallel: 1,
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
    // Below it, only offloading the optimizer states as well makes some plan fit; where the
    // host arena draws on the limited memory too (a CPU run's machine memory) that is no
    // option.
    let offloaded = |stage, every| query.with(stage, every).with_offload(true).plan();
    let hint = query.what_fits(with_ckpt - 1);
    assert!(hint.contains("--offload-optimizer fits ("), "{hint}");
    let named: u64 = hint
        .split(" fits (")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(named < with_ckpt, "{hint}");
    let leanest_offloaded = ZeroStage::ALL
        .map(|s| offloaded(s, Some(1)).unwrap().total())
        .into_iter()
        .min()
        .unwrap();
    assert!(leanest_offloaded <= named);
    assert!(query
        .what_fits(leanest_offloaded - 1)
        .contains("nothing fits"));
    let same_memory = query.what_fits_or(with_ckpt - 1, "remedy", true);
    assert!(
        same_memory.contains("nothing fits") && same_memory.ends_with("remedy"),
        "{same_memory}"
    );
    // The engine refuses a cap below its plan before allocating anything.
    let refused = Run {
        limit: Some(with_ckpt - 1),
        ..Run::new(2, ZeroStage::Zero3, Some(1))
    };
    match refused.go() {
        Err(StepError::Engine(zero::Error::DoesNotFit { .. })) => {}
        other => panic!("expected DoesNotFit, got {:?}", other.err()),
    }
}

/// Under tensor parallelism offloading is refused, so a hint never names it: below the
/// split model's leanest checkpointed plan nothing fits, where at T = 1 offloading would.
#[test]
fn a_cap_below_the_split_plan_names_no_offload() {
    let query = |tensor_parallel| MemoryQuery {
        model: config(),
        micro_batch: B,
        seq_len: T,
        placement: placed(None, false),
        shape: default_shape(2, ZeroStage::Zero0, Precision::Fp32),
        tensor_parallel,
    };
    let split = query(2);
    let leanest = ZeroStage::ALL
        .map(|s| split.with(s, Some(1)).plan().unwrap().total())
        .into_iter()
        .min()
        .unwrap();
    let hint = split.what_fits(leanest - 1);
    assert!(hint.starts_with("nothing fits"), "{hint}");
    let whole = query(1);
    let whole_leanest = ZeroStage::ALL
        .map(|s| whole.with(s, Some(1)).plan().unwrap().total())
        .into_iter()
        .min()
        .unwrap();
    let whole_hint = whole.what_fits(whole_leanest - 1);
    assert!(
        whole_hint.contains("--offload-optimizer fits ("),
        "{whole_hint}"
    );
}

#[test]
fn offloaded_inputs_leave_the_arena_and_the_plan_by_their_bytes() {
    for stage in [ZeroStage::Zero0, ZeroStage::Zero3] {
        let with = |offload| {
            Run {
                placement: placed(Some(1), offload),
                limit: Some(1 << 30),
                layers: 5,
                ..Run::new(2, stage, None)
            }
            .go()
            .unwrap()
        };
        let (kept, offloaded) = (with(false), with(true));
        // L=5, checkpointing every block: 4 kept inputs leave the arena for the host, two
        // staging slots of one input each come in.
        assert_eq!(kept.plan - offloaded.plan, 2 * INPUT, "{stage}");
        assert_eq!(offloaded.peak, offloaded.plan, "{stage}");
        assert_eq!(kept.activations - offloaded.activations, 2 * INPUT);
        assert_eq!((kept.host, offloaded.host), (0, 4 * INPUT), "{stage}");
    }
}

#[test]
fn defragmentation_turns_a_cap_at_the_plan_from_a_failure_into_a_run() {
    for stage in ZeroStage::ALL {
        let free = Run::new(2, stage, Some(1));
        let planned = free.go().unwrap().plan;
        let capped = |defragment| {
            Run {
                limit: Some(planned),
                defragment,
                ..free
            }
            .go()
        };
        // With MD: trains, compacting (beyond the one compaction after start-up).
        let with = capped(true).unwrap();
        assert!(with.peak <= planned, "{stage}");
        assert!(with.defrags > 1, "{stage}: {} compactions", with.defrags);
        // Without: the free bytes would hold the request, but no hole does.
        match capped(false) {
            Err(StepError::Engine(zero::Error::Alloc(AllocError::OutOfMemory {
                rounded,
                stats,
                ..
            }))) => {
                assert!(stats.total_free >= rounded, "{stage}: {stats:?}");
                assert!(stats.largest_free < rounded, "{stage}: {stats:?}");
            }
            other => panic!("{stage}: expected fragmentation, got {:?}", other.err()),
        }
    }
}
