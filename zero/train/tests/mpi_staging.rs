//! The MPI backend's staging inside the rank's arena, one process per rank:
//! `mpirun -np 2 target/debug/deps/mpi_staging-*` (scripts/test.sh finds the binary).
//! Without mpirun it runs as one rank.
//!
//! For every stage and both storage precisions, a GPT trains two steps over MPI with its
//! activations in the arena; afterwards the backend holds no staging outside the block the
//! engine lent it, the plan counts that block, and the arena's peak equals the plan.

use std::process::ExitCode;
use std::time::Duration;

use zero::{EngineConfig, Precision, ZeroStage};
use zero_comm::mpi::Mpi;
use zero_comm::{Communicator, Config, ReduceOp};
use zero_gpt::{init_unit, Gpt, GptConfig, Rng};
use zero_train::bridge::{
    activation_arena_bytes, arena_activations, gpt_engine, kept_inputs, micro_step,
    ActivationPlacement,
};

const T: usize = 16;
const B: usize = 2;

/// What one rank planned and measured after two steps.
struct Measured {
    plan: u64,
    peak: u64,
    staging: u64,
    outside: u64,
}

fn train(comm: Communicator, stage: ZeroStage, precision: Precision) -> Result<Measured, String> {
    let cfg = GptConfig::new(T, 500, 2, 2, 64).map_err(|e| e.to_string())?;
    let model = Gpt::new(cfg).map_err(|e| e.to_string())?;
    let layout = model.layout().clone();
    let placement = ActivationPlacement::default();
    let config = EngineConfig {
        stage,
        precision,
        // Small buckets, so the largest collective is a unit's all-gather at stages 1-3.
        reduce_bucket_bytes: 16 << 10,
        activation_bytes: activation_arena_bytes(&cfg, B, T, placement)
            .map_err(|e| e.to_string())?,
        kept_inputs: kept_inputs(&cfg, B, T, placement).map_err(|e| e.to_string())?,
        ..EngineConfig::default()
    };
    let mut engine = gpt_engine(comm, &layout, None, config, |unit, w| {
        init_unit(&cfg, &layout, unit, 1, w).expect("seeded init of a valid unit")
    })
    .map_err(|e| e.to_string())?;
    let mut acts =
        arena_activations(&mut engine, &model, B, T, placement).map_err(|e| e.to_string())?;
    let mut rng = Rng::new(engine.rank() as u64);
    for _ in 0..2 {
        let seq: Vec<u32> = (0..=B * T).map(|_| (rng.next_u64() % 500) as u32).collect();
        micro_step(&mut engine, &model, &mut acts, &seq[..B * T], &seq[1..])
            .map_err(|e| e.to_string())?;
        engine.step(1e-3).map_err(|e| e.to_string())?;
    }
    Ok(Measured {
        plan: engine.memory_plan().total(),
        peak: engine.arena().stats().peak_allocated as u64,
        staging: engine.memory_plan().backend_staging,
        outside: engine.comm().staging_outside_bytes(),
    })
}

fn check(mpi: &Mpi, stage: ZeroStage, precision: Precision) -> Result<Measured, String> {
    let comm = mpi
        .world(Config::with_timeout(Duration::from_secs(60)))
        .map_err(|e| e.to_string())?;
    let m = train(comm, stage, precision)?;
    if m.staging == 0 {
        return Err("the plan has no staging block for the MPI backend".into());
    }
    if m.outside != 0 {
        return Err(format!("{} staging bytes outside the arena", m.outside));
    }
    if m.peak != m.plan {
        return Err(format!("peak {} != plan {} bytes", m.peak, m.plan));
    }
    Ok(m)
}

fn main() -> ExitCode {
    let mpi = match Mpi::init() {
        Ok(m) => m,
        Err(e) => {
            eprintln!("mpi_staging: {e}");
            return ExitCode::FAILURE;
        }
    };
    let Ok(world) = mpi.world(Config::with_timeout(Duration::from_secs(60))) else {
        eprintln!("mpi_staging: no world communicator");
        return ExitCode::FAILURE;
    };
    let mut failed = 0;
    for stage in ZeroStage::ALL {
        for precision in [Precision::Fp32, Precision::Bf16] {
            let outcome = check(&mpi, stage, precision);
            if let Err(e) = &outcome {
                eprintln!("rank {}: {stage} {precision:?}: {e}", world.rank());
            }
            // Every rank learns whether any rank failed, so all exit alike.
            let mut flag = [f32::from(u8::from(outcome.is_err()))];
            if world.all_reduce_in_place(&mut flag, ReduceOp::Max).is_err() || flag[0] > 0.0 {
                failed += 1;
            }
            if world.rank() == 0 {
                let verdict = match (&outcome, flag[0] > 0.0) {
                    (Ok(m), false) => format!("ok (staging {} of {} bytes)", m.staging, m.plan),
                    _ => "FAILED".into(),
                };
                println!("staging in the arena, {stage} {precision:?} ... {verdict}");
            }
        }
    }
    drop(world);
    drop(mpi);
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
