//! The engine's memory and traffic match the paper's formulas (plus documented padding),
//! and misuse fails with clear errors instead of hangs.

use zero::{
    expected_model_state_bytes, padded_model_state_bytes, Engine, EngineConfig, Error, Precision,
    UnitSpec, ZeroStage, SHARD_ALIGN_ELEMS,
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
    Engine::new(comm, units(), config, |u, w| w.fill(u as f32 + 1.0)).unwrap()
}

/// The forward of a fake model from unit `from` on: every unit gathered and released.
fn fake_forward(e: &mut Engine, from: usize) -> Result<(), Error> {
    for u in from..SIZES.len() {
        e.gather(u)?;
        e.release(u)?;
    }
    Ok(())
}

/// Its backward, in reverse, each unit gathered again and given the parameters themselves
/// as gradient; `poison` puts an inf into that unit's gradient on this rank.
fn fake_backward(e: &mut Engine, poison: Option<usize>) -> Result<(), Error> {
    for u in (0..SIZES.len()).rev() {
        e.gather(u)?;
        e.begin_backward(u)?;
        {
            let (p, mut g) = e.views(&[u], &[u])?;
            g[0].copy_from_slice(p[0]);
            if poison == Some(u) {
                g[0][3] = f32::INFINITY;
            }
        }
        e.end_backward(u)?;
        e.release(u)?;
    }
    e.end_micro_step()?;
    Ok(())
}

/// One optimizer step of the fake model.
fn fake_step(e: &mut Engine) -> Result<(), Error> {
    fake_forward(e, 0)?;
    fake_backward(e, None)?;
    e.step(1e-3)?;
    Ok(())
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
        Engine::new(c, units(), config, |_, w| w.fill(0.0)).map(|_| ())
    });
    for e in errors {
        let msg = e.unwrap_err().to_string();
        assert!(msg.contains("stage 0 needs"), "{msg}");
        assert!(msg.contains("fits"), "{msg}");
    }
}

#[test]
fn a_rank_that_visits_another_unit_gets_an_error_not_a_hang() {
    let results = on_ranks(2, |c| {
        let rank = c.rank();
        let mut e = engine(c, ZeroStage::Zero3);
        e.gather(rank).map(|_| ())
    });
    for r in results {
        match r {
            Err(Error::DivergentOrder { position: 0, .. }) => {}
            other => panic!("expected a divergent order, got {other:?}"),
        }
    }
}

#[test]
fn using_a_unit_outside_gather_is_an_error() {
    on_ranks(2, |c| {
        let mut e = engine(c, ZeroStage::Zero3);
        assert!(matches!(e.params(0), Err(Error::NotGathered { unit: 0 })));
        assert!(matches!(e.release(0), Err(Error::Order(_))));
        assert!(matches!(e.step(1e-3), Err(Error::Order(_))));
        assert!(matches!(
            e.gather(9),
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
            let mut e = Engine::new(c, units(), config, |u, w| w.fill(u as f32 + 1.0)).unwrap();
            fake_step(&mut e).unwrap();
            zero_train::bridge::full_params(&mut e).unwrap()
        })
    };
    let whole = clip_norms(ZeroStage::Zero0);
    let sharded = clip_norms(ZeroStage::Zero2);
    assert_eq!(whole, sharded);
}

#[test]
fn an_fp16_overflow_on_one_rank_skips_the_step_everywhere() {
    let results = on_ranks(2, |c| {
        let mut e = engine_in(c, ZeroStage::Zero2, Precision::Fp16);
        let before = zero_train::bridge::full_params(&mut e).unwrap();
        let scale0 = e.loss_scale();
        let mut reports = vec![];
        for _ in 0..2 {
            // An inf in rank 1's gradient of unit 0.
            let poison = (e.rank() == 1).then_some(0);
            fake_forward(&mut e, 0).unwrap();
            fake_backward(&mut e, poison).unwrap();
            reports.push(e.step(1e-3).unwrap());
        }
        let after = zero_train::bridge::full_params(&mut e).unwrap();
        (before == after, scale0, reports, e.loss_scale())
    });
    for (unchanged, scale0, reports, scale) in results {
        assert!(unchanged, "a skipped step changed the parameters");
        assert!(reports.iter().all(|r| r.skipped));
        // Hysteresis 2: the first overflow keeps the scale, the second halves it.
        assert_eq!((scale0, scale), (65536.0, 32768.0));
    }
}

#[test]
fn end_backward_launches_the_reduction_without_waiting_for_peers() {
    // Rank 1 enters its end_backward only after rank 0's has returned: a blocking reduction
    // on rank 0 would wait for rank 1 forever, so rank 1 gives up waiting after 10 s and the
    // test fails instead of hanging.
    let baton = Baton::new();
    let overlapped = on_ranks(2, |c| {
        let mut e = engine(c, ZeroStage::Zero2);
        // The first step confirms each call with blocking collectives; the second runs
        // free.
        fake_step(&mut e).unwrap();
        fake_forward(&mut e, 0).unwrap();
        let u = SIZES.len() - 1;
        e.gather(u).unwrap();
        e.begin_backward(u).unwrap();
        let rank = e.rank();
        let signalled = rank != 1 || baton.receive();
        e.end_backward(u).unwrap();
        if rank == 0 {
            baton.pass();
        }
        e.release(u).unwrap();
        signalled
    });
    assert!(
        overlapped[1],
        "rank 0's end_backward blocked until its peer arrived"
    );
}

#[test]
fn stage_three_prefetches_the_next_unit_while_the_current_one_computes() {
    // Step 2 of stage 3: both ranks gather unit 0, which also launches unit 1's all-gather.
    // Rank 1 then waits for rank 0 to have gathered unit 1: without the prefetch that gather
    // would need rank 1 to call it too, and rank 1 gives up after 10 s.
    let baton = Baton::new();
    let prefetched = on_ranks(2, |c| {
        let mut e = engine(c, ZeroStage::Zero3);
        fake_step(&mut e).unwrap();
        let rank = e.rank();
        e.gather(0).unwrap();
        let signalled = rank != 1 || baton.receive();
        e.release(0).unwrap();
        e.gather(1).unwrap();
        if rank == 0 {
            baton.pass();
        }
        e.release(1).unwrap();
        // Finish the step as recorded.
        fake_forward(&mut e, 2).unwrap();
        fake_backward(&mut e, None).unwrap();
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
        fake_forward(e, 0).unwrap();
        fake_backward(e, poison).unwrap();
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
fn offloaded(stage: ZeroStage, precision: Precision) -> EngineConfig {
    EngineConfig {
        stage,
        precision,
        offload_optimizer: true,
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

fn offloaded_run(world: usize, stage: ZeroStage, precision: Precision) -> Vec<TwoArenas> {
    on_ranks(world, |c| {
        let config = offloaded(stage, precision);
        let mut e = Engine::new(c, units(), config, |u, w| w.fill(u as f32 + 1.0)).unwrap();
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
/// element) from the engine's arena into the host arena, and each arena peaks at its plan:
/// the engine's over a step, the host's over a step and an export (rank 0 updates the widest
/// range, so it reaches the planned staging).
#[test]
fn offloaded_optimizer_states_leave_the_arena_for_the_host_one() {
    for precision in [Precision::Fp32, Precision::Bf16] {
        for world in [1, 3] {
            for stage in ZeroStage::ALL {
                let padded =
                    padded_model_state_bytes(&SIZES, world, SHARD_ALIGN_ELEMS, stage, precision)
                        .unwrap();
                for r in offloaded_run(world, stage, precision) {
                    let at = format!("{precision:?} {stage} N={world} rank {}", r.rank);
                    assert_eq!(r.device_states as f64, padded.params + padded.grads, "{at}");
                    assert_eq!(r.host_states as f64, padded.optimizer, "{at}");
                    assert_eq!(r.measured, padded, "{at}: both arenas together");
                    assert_eq!(r.plan.model_states.optimizer, 0.0, "{at}");
                    let host_plan = r.plan.offload.expect("an offload plan");
                    assert_eq!(host_plan.states as f64, padded.optimizer, "{at}");
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
    let cap = offloaded_run(world, stage, precision)[0].plan.total();
    let shape = zero::PlanShape {
        stage,
        precision,
        ..zero_train::plan::memory_fit::default_shape(world, stage, precision)
    };
    let schedule = zero::Schedule::sequential(SIZES.len());
    let refused = zero::check_fits(&units(), &schedule, shape, cap);
    assert!(
        matches!(refused, Err(Error::DoesNotFit { .. })),
        "{refused:?}"
    );
    let steps = on_ranks(world, |c| {
        let config = EngineConfig {
            memory_limit: Some(cap),
            ..offloaded(stage, precision)
        };
        let mut e = Engine::new(c, units(), config, |_, w| w.fill(1.0)).unwrap();
        fake_step(&mut e).unwrap();
        fake_step(&mut e).unwrap();
        e.steps()
    });
    assert_eq!(steps, [2, 2]);
}
