//! The engine's memory and traffic match the paper's formulas (plus documented padding),
//! and misuse fails with clear errors instead of hangs.

mod common;

use common::FnModel;
use zero::{
    expected_model_state_bytes, padded_model_state_bytes, Engine, EngineConfig, Error, Op, OpUnits,
    Precision, Program, UnitSpec, ZeroStage, SHARD_ALIGN_ELEMS,
};

/// Unit sizes that no world size divides evenly.
const SIZES: [usize; 4] = [1000, 7, 4096, 333];

fn units() -> Vec<UnitSpec> {
    SIZES
        .iter()
        .enumerate()
        .map(|(i, &n)| UnitSpec::new(format!("u{i}"), n))
        .collect()
}

fn engine(comm: zero_comm::Communicator, stage: ZeroStage) -> Engine {
    engine_in(comm, stage, Precision::Fp32)
}

fn engine_in(comm: zero_comm::Communicator, stage: ZeroStage, precision: Precision) -> Engine {
    let config = EngineConfig {
        stage,
        precision,
        ..EngineConfig::default()
    };
    engine_with(comm, config)
}

fn engine_with(comm: zero_comm::Communicator, config: EngineConfig) -> Engine {
    let program = program();
    Engine::new(comm, units(), &[program.schedule()], config, |u, w| {
        w.fill(u as f32 + 1.0)
    })
    .unwrap()
}

/// A fake model's operation: forward or backward of a unit, or the loss between them.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fake {
    Forward(usize),
    Loss,
    Backward(usize),
}

/// Forward over every unit, the loss (which reads no unit, so every unit is gathered again
/// for backward, as the paper's 3 Psi assumes), backward in reverse.
fn program() -> Program<Fake> {
    let n = SIZES.len();
    let mut ops: Vec<_> = (0..n)
        .map(|u| Op::new(Fake::Forward(u)).reads([u]))
        .collect();
    ops.push(Op::new(Fake::Loss));
    ops.extend(
        (0..n)
            .rev()
            .map(|u| Op::new(Fake::Backward(u)).reads([u]).writes([u])),
    );
    Program::new(ops, n).unwrap()
}

/// The fake model: each backward gives the parameters themselves as gradient; `poison` puts
/// an inf into that unit's gradient on this rank; `at` runs before each operation.
fn fake(
    poison: Option<usize>,
    mut at: impl FnMut(Fake),
) -> FnModel<Fake, impl FnMut(&Fake, &mut OpUnits<'_>) -> Result<(), Error>> {
    FnModel::new(move |&op: &Fake, units: &mut OpUnits<'_>| {
        at(op);
        if let Fake::Backward(u) = op {
            let (p, mut g) = units.views()?;
            g[0].copy_from_slice(p[0]);
            if poison == Some(u) {
                g[0][3] = f32::INFINITY;
            }
        }
        Ok(())
    })
}

/// One micro-step of the fake model.
fn fake_micro_step(e: &mut Engine, poison: Option<usize>) -> Result<(), Error> {
    e.micro_step(&program(), &mut fake(poison, |_| {}))
}

/// One optimizer step of the fake model.
fn fake_step(e: &mut Engine) -> Result<(), Error> {
    fake_micro_step(e, None)?;
    e.step(1e-3)?;
    Ok(())
}

/// Every unit's whole parameters.
fn params(e: &mut Engine) -> Vec<Vec<f32>> {
    (0..SIZES.len())
        .map(|u| e.read_params(u).unwrap())
        .collect()
}

/// Runs `f` on every rank of a local group of `world` and collects the results.
fn on_ranks<R: Send>(world: usize, f: impl Fn(zero_comm::Communicator) -> R + Sync) -> Vec<R> {
    let comms = zero_comm::local::create(world).unwrap();
    std::thread::scope(|s| {
        let hs: Vec<_> = comms.into_iter().map(|c| s.spawn(|| f(c))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// A one-shot signal from rank 0 to rank 1 that rank 1 waits for at most 10 s, so a test of
/// "rank 0 does not wait for rank 1" fails instead of hanging when rank 0 does wait.
struct Baton {
    tx: std::sync::Mutex<std::sync::mpsc::Sender<()>>,
    rx: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
}

impl Baton {
    fn new() -> Self {
        let (tx, rx) = std::sync::mpsc::channel();
        Self {
            tx: std::sync::Mutex::new(tx),
            rx: std::sync::Mutex::new(rx),
        }
    }

    fn pass(&self) {
        self.tx.lock().unwrap().send(()).unwrap();
    }

    /// True when the baton arrived in time.
    fn receive(&self) -> bool {
        let rx = self.rx.lock().unwrap();
        rx.recv_timeout(std::time::Duration::from_secs(10)).is_ok()
    }
}

#[test]
fn measured_model_states_equal_the_padded_formula() {
    for precision in [Precision::Fp32, Precision::Bf16] {
        for world in [1, 2, 4, 8] {
            for stage in ZeroStage::ALL {
                check_model_states(precision, world, stage);
            }
        }
    }
}

fn check_model_states(precision: Precision, world: usize, stage: ZeroStage) {
    {
        {
            let measured = on_ranks(world, |c| {
                engine_in(c, stage, precision)
                    .measured_model_state_bytes()
                    .unwrap()
            });
            let padded =
                padded_model_state_bytes(&SIZES, world, SHARD_ALIGN_ELEMS, stage, precision)
                    .unwrap();
            let psi = SIZES.iter().sum::<usize>() as u64;
            let paper = expected_model_state_bytes(psi, world, stage, precision);
            for m in measured {
                assert_eq!(m, padded, "{stage}, N={world}");
                // Padding: under one shard quantum (world x 128 elements) per unit, per kind.
                let slack = 16.0 * (world * SHARD_ALIGN_ELEMS * SIZES.len()) as f64;
                assert!(m.total() >= paper.total() && m.total() - paper.total() < slack);
            }
        }
    }
}

#[test]
fn stage_three_saves_memory_linearly_in_ranks() {
    let at = |world| {
        on_ranks(world, |c| {
            engine(c, ZeroStage::Zero3)
                .measured_model_state_bytes()
                .unwrap()
                .total()
        })[0]
    };
    let (one, four) = (at(1), at(4));
    assert!(four * 4.0 <= one * 1.1, "N=1: {one}, N=4: {four}");
}

#[test]
fn traffic_per_step_is_two_psi_or_three_psi_at_stage_three() {
    let world = 4;
    let padded: Vec<u64> = SIZES
        .iter()
        .map(|&n| zero::Partition::new(n, world, SHARD_ALIGN_ELEMS).unwrap())
        .map(|p| p.padded_numel() as u64)
        .collect();
    let psi: u64 = padded.iter().sum();
    for stage in ZeroStage::ALL {
        let traffic = on_ranks(world, |c| {
            let mut e = engine(c, stage);
            fake_step(&mut e).unwrap();
            let first = e.traffic();
            fake_step(&mut e).unwrap();
            (first, e.traffic())
        });
        for (first, second) in traffic {
            let per_step = second.elements() - first.elements();
            // The fake model gathers every unit for forward and again for backward, as the
            // paper's 3 Psi assumes.
            let want = if stage == ZeroStage::Zero3 {
                3 * psi
            } else {
                2 * psi
            };
            assert_eq!(per_step, want, "{stage}: {second:?}");
        }
    }
}

#[test]
fn a_cap_too_small_for_stage_zero_names_a_stage_that_fits() {
    let errors = on_ranks(4, |c| {
        let config = EngineConfig {
            stage: ZeroStage::Zero0,
            memory_limit: Some(100_000),
            ..EngineConfig::default()
        };
        let program = program();
        Engine::new(c, units(), &[program.schedule()], config, |_, w| {
            w.fill(0.0)
        })
        .map(|_| ())
    });
    for e in errors {
        let msg = e.unwrap_err().to_string();
        assert!(msg.contains("stage 0 needs"), "{msg}");
        assert!(msg.contains("fits"), "{msg}");
    }
}

#[test]
fn ranks_that_declare_different_programs_are_refused_at_start_up_naming_the_call() {
    let results = on_ranks(2, |c| {
        // Rank 1's forward visits unit 1 before unit 0.
        let mut ops = vec![Op::new(0).reads([0]), Op::new(1).reads([1])];
        if c.rank() == 1 {
            ops.swap(0, 1);
        }
        let program = Program::new(ops, SIZES.len()).unwrap();
        let config = EngineConfig {
            stage: ZeroStage::Zero3,
            ..EngineConfig::default()
        };
        Engine::new(c, units(), &[program.schedule()], config, |_, w| {
            w.fill(0.0)
        })
        .map(|_| ())
    });
    for (rank, r) in results.into_iter().enumerate() {
        let msg = r.unwrap_err().to_string();
        let (mine, theirs) = match rank {
            0 => ("gather(0)", "gather(1)"),
            _ => ("gather(1)", "gather(0)"),
        };
        assert!(msg.contains(&format!("makes {mine} at call 0")), "{msg}");
        assert!(
            msg.contains(&format!("rank {}'s makes {theirs}", 1 - rank)),
            "{msg}"
        );
    }
}

#[test]
fn a_step_without_a_micro_step_and_an_unknown_unit_are_errors() {
    on_ranks(2, |c| {
        let mut e = engine(c, ZeroStage::Zero3);
        assert!(matches!(e.step(1e-3), Err(Error::Order(_))));
        assert!(matches!(
            e.read_params(9),
            Err(Error::NoSuchUnit { unit: 9, units: 4 })
        ));
    });
}

#[test]
fn gradient_clipping_on_shards_equals_clipping_whole() {
    let clip_norms = |stage| {
        on_ranks(2, |c| {
            let config = EngineConfig {
                stage,
                grad_clip: 0.5,
                ..EngineConfig::default()
            };
            let mut e = engine_with(c, config);
            fake_step(&mut e).unwrap();
            params(&mut e)
        })
    };
    let whole = clip_norms(ZeroStage::Zero0);
    let sharded = clip_norms(ZeroStage::Zero2);
    assert_eq!(whole, sharded);
}

/// Whether the gradients are accumulated in the engine's arena or, offloaded, in the host
/// arena (by the host arena's kernels), or in their own host arena beside the delayed
/// update, an inf on one rank skips the step on every rank.
#[test]
fn an_fp16_overflow_on_one_rank_skips_the_step_everywhere() {
    for grads in [
        None,
        Some((false, false)),
        Some((true, false)),
        Some((true, true)),
    ] {
        overflow_skips_the_step(grads);
    }
}

/// `grads`: `None` without offload, else the optimizer offloaded, with or without the
/// gradients, and with or without the delayed update.
fn overflow_skips_the_step(grads: Option<(bool, bool)>) {
    let results = on_ranks(2, |c| {
        let config = match grads {
            None => EngineConfig {
                stage: ZeroStage::Zero2,
                precision: Precision::Fp16,
                ..EngineConfig::default()
            },
            Some((g, delayed)) => EngineConfig {
                delayed_param_update: delayed,
                ..offloaded(ZeroStage::Zero2, Precision::Fp16, g)
            },
        };
        let mut e = engine_with(c, config);
        let before = params(&mut e);
        let scale0 = e.loss_scale();
        let mut reports = vec![];
        for _ in 0..2 {
            // An inf in rank 1's gradient of unit 0.
            let poison = (e.rank() == 1).then_some(0);
            fake_micro_step(&mut e, poison).unwrap();
            reports.push(e.step(1e-3).unwrap());
        }
        let after = params(&mut e);
        (before == after, scale0, reports, e.loss_scale())
    });
    for (unchanged, scale0, reports, scale) in results {
        assert!(
            unchanged,
            "{grads:?}: a skipped step changed the parameters"
        );
        assert!(reports.iter().all(|r| r.skipped), "{grads:?}");
        // Hysteresis 2: the first overflow keeps the scale, the second halves it.
        assert_eq!((scale0, scale), (65536.0, 32768.0), "{grads:?}");
    }
}

#[test]
fn end_backward_launches_the_reduction_without_waiting_for_peers() {
    // Rank 1 leaves the last unit's backward (whose reduction follows at once) only after
    // rank 0 has run the next unit's backward: a blocking reduction on rank 0 would wait for
    // rank 1 forever, so rank 1 gives up waiting after 10 s and the test fails instead of
    // hanging.
    let baton = Baton::new();
    let last = SIZES.len() - 1;
    let overlapped = on_ranks(2, |c| {
        let mut e = engine(c, ZeroStage::Zero2);
        let rank = e.rank();
        let mut signalled = true;
        let mut model = fake(None, |op| match (rank, op) {
            (1, Fake::Backward(u)) if u == last => signalled = baton.receive(),
            (0, Fake::Backward(u)) if u == last - 1 => baton.pass(),
            _ => {}
        });
        e.micro_step(&program(), &mut model).unwrap();
        drop(model);
        signalled
    });
    assert!(
        overlapped[1],
        "rank 0's end_backward blocked until its peer arrived"
    );
}

#[test]
fn stage_three_prefetches_the_next_unit_while_the_current_one_computes() {
    // Both ranks gather unit 0, which also launches unit 1's all-gather. Rank 1, in unit 0's
    // forward, waits for rank 0 to reach unit 1's forward: without the prefetch unit 1's
    // gather would need rank 1 to call it too, and rank 1 gives up after 10 s.
    let baton = Baton::new();
    let prefetched = on_ranks(2, |c| {
        let mut e = engine(c, ZeroStage::Zero3);
        let rank = e.rank();
        let mut signalled = true;
        let mut model = fake(None, |op| match (rank, op) {
            (1, Fake::Forward(0)) => signalled = baton.receive(),
            (0, Fake::Forward(1)) => baton.pass(),
            _ => {}
        });
        e.micro_step(&program(), &mut model).unwrap();
        drop(model);
        e.step(1e-3).unwrap();
        signalled
    });
    assert!(prefetched[1], "unit 1 was not prefetched");
}

#[test]
fn a_resumed_fp16_scaler_halves_where_the_uninterrupted_one_does() {
    // One overflowing step (rank 1 puts an inf in unit 0's gradient) on an fp16 engine.
    let overflow = |e: &mut Engine| {
        let poison = (e.rank() == 1).then_some(0);
        fake_micro_step(e, poison).unwrap();
        assert!(e.step(1e-3).unwrap().skipped);
    };
    // Uninterrupted: two overflows, the second halves the scale (hysteresis 2).
    let saved = on_ranks(2, |c| {
        let mut e = engine_in(c, ZeroStage::Zero2, Precision::Fp16);
        overflow(&mut e);
        let after_one = (e.loss_scale(), e.loss_scaler().progress());
        overflow(&mut e);
        (after_one, e.loss_scale())
    });
    let ((scale, (clean, left)), uninterrupted) = saved[0];
    assert_eq!(uninterrupted, 32768.0);
    // Resumed after the first overflow, with and without the scaler's progress.
    let resumed = |progress: Option<(u32, u32)>| {
        on_ranks(2, |c| {
            let mut e = engine_in(c, ZeroStage::Zero2, Precision::Fp16);
            let (clean, left) = progress.unwrap_or(e.loss_scaler().progress());
            e.set_loss_scaler(scale, clean, left);
            overflow(&mut e);
            e.loss_scale()
        })[0]
    };
    assert_eq!(resumed(Some((clean, left))), uninterrupted);
    assert_eq!(
        resumed(None),
        65536.0,
        "a fresh hysteresis tolerates the overflow"
    );
}

/// ZeRO-Offload with the engine's settings for `stage` and `precision`, in an arena with room
/// to spare: at a capacity of exactly the plan (the default), an allocation that finds the
/// free bytes split around buckets in flight lands them early (`transient.rs`) and the peak
/// ends below the plan.
/// With `grads`, the kept gradients go to the host arena too.
fn offloaded(stage: ZeroStage, precision: Precision, grads: bool) -> EngineConfig {
    EngineConfig {
        stage,
        precision,
        offload_optimizer: true,
        offload_gradients: grads,
        memory_limit: Some(1 << 30),
        ..EngineConfig::default()
    }
}

/// What one rank saw of its two arenas: bytes after start-up, and peaks.
#[derive(Debug)]
struct TwoArenas {
    rank: usize,
    device_states: usize,
    host_states: usize,
    device_step_peak: usize,
    host_peak: usize,
    plan: zero::MemoryPlan,
    measured: zero::ModelStateBytes,
}

fn offloaded_run(
    world: usize,
    stage: ZeroStage,
    precision: Precision,
    grads: bool,
) -> Vec<TwoArenas> {
    on_ranks(world, |c| {
        let config = offloaded(stage, precision, grads);
        let mut e = engine_with(c, config);
        let host = |e: &Engine| e.offload_arena().expect("an offload arena").stats();
        let (device_states, host_states) = (e.arena().stats().allocated, host(&e).allocated);
        fake_step(&mut e).unwrap();
        let device_step_peak = e.arena().stats().peak_allocated;
        e.export_states().unwrap();
        TwoArenas {
            rank: e.rank(),
            device_states,
            host_states,
            device_step_peak,
            host_peak: host(&e).peak_allocated,
            plan: e.memory_plan(),
            measured: e.measured_model_state_bytes().unwrap(),
        }
    })
}

/// ZeRO-Offload moves exactly the optimizer states (the padded formula's K bytes per kept
/// element), and with `offload_gradients` the kept gradients too, from the engine's arena
/// into the host arena, and each arena peaks at its plan: the engine's over a step, the
/// host's over a step and an export (rank 0 updates the widest range, so it reaches the
/// planned staging).
#[test]
fn offloaded_optimizer_states_leave_the_arena_for_the_host_one() {
    for (precision, grads) in [Precision::Fp32, Precision::Bf16]
        .into_iter()
        .flat_map(|p| [(p, false), (p, true)])
    {
        for world in [1, 3] {
            for stage in ZeroStage::ALL {
                let padded =
                    padded_model_state_bytes(&SIZES, world, SHARD_ALIGN_ELEMS, stage, precision)
                        .unwrap();
                let moved = if grads { padded.grads } else { 0.0 };
                for r in offloaded_run(world, stage, precision, grads) {
                    let at = format!(
                        "{precision:?} {stage} N={world} grads {grads} rank {}",
                        r.rank
                    );
                    let device = padded.params + padded.grads - moved;
                    assert_eq!(r.device_states as f64, device, "{at}");
                    assert_eq!(r.host_states as f64, padded.optimizer + moved, "{at}");
                    assert_eq!(r.measured, padded, "{at}: both arenas together");
                    assert_eq!(r.plan.model_states.optimizer, 0.0, "{at}");
                    assert_eq!(r.plan.model_states.grads, padded.grads - moved, "{at}");
                    let host_plan = r.plan.offload.expect("an offload plan");
                    assert_eq!(host_plan.states as f64, padded.optimizer, "{at}");
                    assert_eq!(host_plan.grads as f64, moved, "{at}");
                    if r.rank == 0 {
                        assert_eq!(r.device_step_peak as u64, r.plan.total(), "{at}");
                        assert_eq!(r.host_peak as u64, host_plan.total(), "{at}");
                    }
                }
            }
        }
    }
}

/// A device cap that the plan with optimizer states on the device exceeds is refused without
/// offload and trains with it.
#[test]
fn offloading_the_optimizer_fits_a_cap_the_states_do_not() {
    let (stage, precision, world) = (ZeroStage::Zero2, Precision::Bf16, 2);
    let cap = offloaded_run(world, stage, precision, false)[0]
        .plan
        .total();
    let config = EngineConfig {
        stage,
        precision,
        ..EngineConfig::default()
    };
    let shape = config.plan_shape(world, zero_comm::StagingRule::None);
    let program = program();
    let refused = zero::check_fits(&units(), &[program.schedule()], shape, cap);
    assert!(
        matches!(refused, Err(Error::DoesNotFit { .. })),
        "{refused:?}"
    );
    let steps = on_ranks(world, |c| {
        let config = EngineConfig {
            memory_limit: Some(cap),
            ..offloaded(stage, precision, false)
        };
        let mut e = engine_with(c, config);
        fake_step(&mut e).unwrap();
        fake_step(&mut e).unwrap();
        e.steps()
    });
    assert_eq!(steps, [2, 2]);
}

/// Gradient offload without the optimizer offloaded is refused at start-up naming the flag
/// and why; beside the delayed update it starts (its gradients get a host arena of their
/// own).
#[test]
fn gradient_offload_without_its_host_arena_is_refused_at_start_up() {
    let program = program();
    let start = |config: EngineConfig| {
        let comm = zero_comm::local::create(1).unwrap().remove(0);
        Engine::new(comm, units(), &[program.schedule()], config, |_, w| {
            w.fill(1.0)
        })
    };
    let alone = EngineConfig {
        offload_gradients: true,
        ..EngineConfig::default()
    };
    let delayed = EngineConfig {
        offload_optimizer: true,
        delayed_param_update: true,
        ..alone
    };
    match start(alone) {
        Err(Error::Config(m)) => {
            assert!(m.contains("--offload-gradients") && m.contains("--offload-optimizer"));
        }
        other => panic!("{other:?}"),
    }
    let e = start(delayed).unwrap();
    assert!(e.offload_grads_arena().is_some());
}
