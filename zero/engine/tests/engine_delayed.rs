//! The delayed parameter update (`EngineConfig::delayed_param_update`, DeepSpeed's DPU): each
//! step's host AdamW runs on a thread while the next step computes on the parameters of the
//! step before. Checked against an engine without it whose model computes each step's
//! gradients from the parameters it read a step earlier: the same arithmetic, to the bit, at
//! every stage and precision, with the optimizer in the host arena or its file and, at stage
//! 3, the parameter shards offloaded to the host or their file; different from the
//! undelayed run; the host arena peaks at its plan; and a configuration it cannot run in is
//! refused at start-up.

mod common;

use common::tiers::{bits, engine, on_ranks, TempDir};
use common::FnModel;
use std::cell::RefCell;
use std::path::Path;
use zero::{Engine, EngineConfig, Error, OpUnits, Precision, ZeroStage};

/// `stage` and `precision` with the optimizer in the host arena, in 2 KiB buckets.
fn config(stage: ZeroStage, precision: Precision, delayed: bool) -> EngineConfig {
    EngineConfig {
        stage,
        precision,
        reduce_bucket_bytes: 2048,
        offload_optimizer: true,
        delayed_param_update: delayed,
        ..EngineConfig::default()
    }
}

/// One micro-step and step whose backward gives each unit's gradient as its parameters times
/// `factor`: the parameters it reads now, or with `stale` those it read at the step before
/// (its own at the first), kept in `seen`.
fn train_step(e: &mut Engine, factor: f32, stale: bool, seen: &RefCell<Vec<Option<Vec<f32>>>>) {
    let mut model = FnModel::new(|&(back, unit): &(bool, usize), units: &mut OpUnits<'_>| {
        if back {
            let (p, mut g) = units.views()?;
            let now = p[0].to_vec();
            let from = match stale {
                true => seen.borrow_mut()[unit].replace(now.clone()).unwrap_or(now),
                false => now,
            };
            for (g, p) in g[0].iter_mut().zip(&from) {
                *g = p * factor;
            }
        }
        Ok(())
    });
    e.micro_step(&common::sequential(4), &mut model).unwrap();
    e.step(1e-2).unwrap();
}

/// `config` with the optimizer's states in its file and, with `params`, the parameter
/// shards offloaded (`Some(true)`: to their file).
fn in_files(config: EngineConfig, params: Option<bool>) -> EngineConfig {
    EngineConfig {
        optimizer_file: true,
        offload_params: params.is_some(),
        params_file: params == Some(true),
        ..config
    }
}

/// Rank 0's exported states after four steps, as bits.
fn trained(world: usize, config: EngineConfig, stale: bool) -> Vec<u32> {
    trained_in(world, config, stale, None)
}

/// [`trained`] with the file tiers' folder `dir`.
fn trained_in(world: usize, config: EngineConfig, stale: bool, dir: Option<&Path>) -> Vec<u32> {
    let mut runs = on_ranks(world, |c| {
        let mut e = engine(c, config, dir).unwrap();
        let seen = RefCell::new(vec![None; 4]);
        for step in 0..4 {
            train_step(&mut e, 1e-3 * (1.0 + step as f32), stale, &seen);
        }
        bits(&e.export_states().unwrap())
    });
    runs.swap_remove(0)
}

#[test]
fn the_delayed_update_is_an_update_from_gradients_one_step_stale_to_the_bit() {
    for precision in [Precision::Fp32, Precision::Bf16, Precision::Fp16] {
        for stage in ZeroStage::ALL {
            for world in [1, 2] {
                let what = format!("{precision:?} {stage} N={world}");
                let delayed = trained(world, config(stage, precision, true), false);
                let reference = trained(world, config(stage, precision, false), true);
                assert!(delayed == reference, "{what}");
                let undelayed = trained(world, config(stage, precision, false), false);
                assert!(delayed != undelayed, "{what}: the update was not delayed");
            }
        }
    }
}

/// With the optimizer's states streamed through its file on the thread, and at stage 3 the
/// parameter shards in the host arena or their file, the delayed update is still the
/// update from gradients one step stale, to the bit.
#[test]
fn the_delayed_update_from_files_is_the_stale_update_to_the_bit() {
    let dir = TempDir::new("delayed");
    for precision in [Precision::Fp32, Precision::Bf16, Precision::Fp16] {
        for (stage, params) in ZeroStage::ALL.into_iter().map(|s| (s, None)).chain([
            (ZeroStage::Zero3, Some(false)),
            (ZeroStage::Zero3, Some(true)),
        ]) {
            for world in [1, 2] {
                let what = format!("{precision:?} {stage} params {params:?} N={world}");
                let at = |delayed| in_files(config(stage, precision, delayed), params);
                let delayed = trained_in(world, at(true), false, Some(&dir.0));
                let reference = trained_in(world, at(false), true, Some(&dir.0));
                assert!(delayed == reference, "{what}");
                let in_host = trained(world, config(stage, precision, true), false);
                assert!(
                    delayed == in_host,
                    "{what}: against the host arena's delayed update"
                );
            }
        }
    }
}

/// With the kept gradients offloaded (`offload_gradients`), they land in a host arena of
/// their own while the thread holds the optimizer's: the delayed update is still the update
/// from gradients one step stale, to the bit, with the optimizer in the host arena or its
/// file; the rank's arena holds no gradient, and the gradients' arena peaks at its plan.
#[test]
fn offloaded_gradients_beside_the_delayed_update_are_the_stale_update_to_the_bit() {
    let dir = TempDir::new("delayed-grads");
    for precision in [Precision::Fp32, Precision::Bf16, Precision::Fp16] {
        for stage in ZeroStage::ALL {
            let reference = trained(2, config(stage, precision, false), true);
            for file in [false, true] {
                let what = format!("{precision:?} {stage} file {file}");
                let delayed = EngineConfig {
                    offload_gradients: true,
                    ..config(stage, precision, true)
                };
                let c = if file {
                    in_files(delayed, None)
                } else {
                    delayed
                };
                let got = trained_with_grads_arena(c, &dir.0, &what);
                assert!(got == reference, "{what}");
            }
        }
    }
}

/// [`trained`] on two ranks, checking on each that the gradients' own host arena holds them
/// all and peaks at its plan, and that the optimizer's host arena peaks within its plan.
fn trained_with_grads_arena(config: EngineConfig, dir: &Path, what: &str) -> Vec<u32> {
    let mut runs = on_ranks(2, |c| {
        let mut e = engine(c, config, Some(dir)).unwrap();
        let seen = RefCell::new(vec![None; 4]);
        for step in 0..4 {
            train_step(&mut e, 1e-3 * (1.0 + step as f32), false, &seen);
        }
        let exported = bits(&e.export_states().unwrap());
        let plan = e.memory_plan().offload.unwrap();
        assert!(plan.grads_apart && plan.grads > 0, "{what}: {plan:?}");
        let grads = e.offload_grads_arena().unwrap().stats();
        // On the CPU a landed segment is added from the bucket in place: no landing block.
        assert_eq!(plan.landing, 0, "{what}");
        assert_eq!(grads.peak_allocated as u64, plan.grads, "{what}");
        assert_eq!(plan.grads_arena(), plan.grads, "{what}");
        assert_eq!(e.offloaded_grad_bytes().unwrap(), plan.grads, "{what}");
        assert_eq!(
            e.measured_model_state_bytes().unwrap().grads,
            plan.grads as f64
        );
        // The delayed update's blocks are planned for the widest owned range: rank 0's.
        let host = e.offload_arena().unwrap().stats().peak_allocated as u64;
        match e.rank() {
            0 => assert_eq!(host, plan.optimizer_arena(), "{what}"),
            _ => assert!(host <= plan.optimizer_arena(), "{what}"),
        }
        exported
    });
    runs.swap_remove(0)
}

#[test]
fn the_host_arena_peaks_at_its_plan() {
    let dir = TempDir::new("delayed-plan");
    for (precision, file) in [Precision::Fp32, Precision::Bf16]
        .into_iter()
        .flat_map(|p| [(p, false), (p, true)])
    {
        on_ranks(1, |c| {
            let delayed = config(ZeroStage::Zero2, precision, true);
            let config = if file {
                in_files(delayed, None)
            } else {
                delayed
            };
            let mut e = engine(c, config, Some(&dir.0)).unwrap();
            let seen = RefCell::new(vec![None; 4]);
            for step in 0..2 {
                train_step(&mut e, 1e-3 * (1.0 + step as f32), false, &seen);
            }
            e.land_delayed().unwrap();
            let plan = e.memory_plan().offload.unwrap();
            assert!(plan.delayed > 0, "{plan:?}");
            let host = e.offload_arena().unwrap().stats();
            assert_eq!(
                host.peak_allocated as u64,
                plan.optimizer_arena(),
                "{precision:?} file {file}"
            );
        });
    }
}

#[test]
fn a_configuration_the_delayed_update_cannot_run_in_is_refused() {
    let base = config(ZeroStage::Zero2, Precision::Fp32, true);
    let cases = [(
        EngineConfig {
            offload_optimizer: false,
            ..base
        },
        "--offload-optimizer cpu or nvme",
    )];
    for (c, want) in cases {
        let err: Vec<Error> = on_ranks(1, |comm| engine(comm, c, None).map(|_| ()).unwrap_err());
        let text = err[0].to_string();
        assert!(text.contains(want), "{text}");
    }
}
