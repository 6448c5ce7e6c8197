//! The delayed parameter update (`EngineConfig::delayed_param_update`, DeepSpeed's DPU): each
//! step's host AdamW runs on a thread while the next step computes on the parameters of the
//! step before. Checked against an engine without it whose model computes each step's
//! gradients from the parameters it read a step earlier: the same arithmetic, to the bit, at
//! every stage and precision; different from the undelayed run; the host arena peaks at its
//! plan; and a configuration it cannot run in is refused at start-up.

mod common;

use common::tiers::{bits, engine, on_ranks};
use common::FnModel;
use std::cell::RefCell;
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

/// Rank 0's exported states after four steps, as bits.
fn trained(world: usize, config: EngineConfig, stale: bool) -> Vec<u32> {
    let mut runs = on_ranks(world, |c| {
        let mut e = engine(c, config, None).unwrap();
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

#[test]
fn the_host_arena_peaks_at_its_plan() {
    for precision in [Precision::Fp32, Precision::Bf16] {
        on_ranks(1, |c| {
            let mut e = engine(c, config(ZeroStage::Zero2, precision, true), None).unwrap();
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
                "{precision:?}"
            );
        });
    }
}

#[test]
fn a_configuration_the_delayed_update_cannot_run_in_is_refused() {
    let base = config(ZeroStage::Zero2, Precision::Fp32, true);
    let cases = [
        (
            EngineConfig {
                offload_optimizer: false,
                ..base
            },
            "--offload-optimizer cpu",
        ),
        (
            EngineConfig {
                optimizer_file: true,
                ..base
            },
            "not nvme",
        ),
        (
            EngineConfig {
                stage: ZeroStage::Zero3,
                offload_params: true,
                ..base
            },
            "--offload-params",
        ),
    ];
    for (c, want) in cases {
        let err: Vec<Error> = on_ranks(1, |comm| engine(comm, c, None).map(|_| ()).unwrap_err());
        let text = err[0].to_string();
        assert!(text.contains(want), "{text}");
    }
}
