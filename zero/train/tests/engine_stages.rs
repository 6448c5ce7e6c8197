//! ZeRO stages 0-3 train the tiny GPT to the same parameters and losses, to the bit, at
//! every world size; world sizes agree to floating-point tolerance.

use zero::{EngineConfig, Precision, ZeroStage};
use zero_gpt::{init_unit, Gpt, GptConfig, Rng};
use zero_train::bridge::{full_params, gpt_engine, micro_step};

const T: usize = 16;
const STEPS: usize = 3;

/// The global batch of step `step`: (tokens, targets) of `rows` sequences.
fn global_batch(step: usize, rows: usize, vocab: u32) -> (Vec<u32>, Vec<u32>) {
    let mut rng = Rng::new(1000 + step as u64);
    let seq: Vec<u32> = (0..rows * T + 1)
        .map(|_| (rng.next_u64() % u64::from(vocab)) as u32)
        .collect();
    (seq[..rows * T].to_vec(), seq[1..].to_vec())
}

struct Run {
    losses: Vec<f32>,
    params: Vec<Vec<f32>>,
    grad_norms: Vec<f32>,
}

/// Trains `STEPS` steps of a global batch of `global_rows` sequences over `world` ranks with
/// `accum` micro-steps per step; returns rank 0's view.
fn train(world: usize, stage: ZeroStage, global_rows: usize, accum: usize) -> Run {
    train_in(Precision::Fp32, world, stage, global_rows, accum)
}

fn train_in(
    precision: Precision,
    world: usize,
    stage: ZeroStage,
    global_rows: usize,
    accum: usize,
) -> Run {
    let config = EngineConfig {
        stage,
        precision,
        ..EngineConfig::default()
    };
    train_with(config, world, global_rows, accum)
}

fn train_with(engine_config: EngineConfig, world: usize, global_rows: usize, accum: usize) -> Run {
    let config = GptConfig::tiny();
    let comms = zero_comm::local::create(world).unwrap();
    let rows = global_rows / world / accum;
    assert_eq!(rows * world * accum, global_rows);
    let runs: Vec<Run> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|comm| {
                s.spawn(move || {
                    let model = Gpt::new(config).unwrap();
                    let layout = model.layout().clone();
                    let mut engine = gpt_engine(comm, &layout, None, engine_config, |unit, w| {
                        init_unit(&config, &layout, unit, 7, w).unwrap()
                    })
                    .unwrap();
                    let rank = engine.rank();
                    let mut acts = model.activations(rows, T).unwrap();
                    let mut run = Run {
                        losses: vec![],
                        params: vec![],
                        grad_norms: vec![],
                    };
                    for step in 0..STEPS {
                        let (x, y) = global_batch(step, global_rows, config.vocab_size as u32);
                        let mut local = 0.0;
                        for micro in 0..accum {
                            // Micro-step k of rank r takes rows [(k*world + r) * rows, ..).
                            let at = (micro * world + rank) * rows * T..;
                            let at = at.start..at.start + rows * T;
                            local +=
                                micro_step(&mut engine, &model, &mut acts, &x[at.clone()], &y[at])
                                    .unwrap();
                        }
                        let mut loss = [local / accum as f32];
                        engine
                            .comm()
                            .all_reduce_in_place(&mut loss, zero_comm::ReduceOp::Avg)
                            .unwrap();
                        let report = engine.step(1e-2).unwrap();
                        run.losses.push(loss[0]);
                        run.grad_norms.push(report.grad_norm);
                    }
                    run.params = full_params(&mut engine).unwrap();
                    run
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // Every rank holds the same parameters after the step.
    for r in &runs[1..] {
        assert_eq!(bits(&r.params), bits(&runs[0].params), "ranks disagree");
    }
    runs.into_iter().next().unwrap()
}

fn bits(units: &[Vec<f32>]) -> Vec<u32> {
    units.iter().flatten().map(|x| x.to_bits()).collect()
}

fn assert_same_bits(a: &Run, b: &Run, what: &str) {
    assert_eq!(
        a.losses.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        b.losses.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        "{what}: losses"
    );
    assert_eq!(
        a.grad_norms.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        b.grad_norms.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        "{what}: grad norms"
    );
    assert!(
        bits(&a.params) == bits(&b.params),
        "{what}: parameters differ"
    );
}

#[test]
fn every_stage_gives_the_same_bits_at_every_world_size() {
    // 12 rows: divisible by 1, 2, 3 and 4 ranks; tiny's units are not multiples of 3 x 128.
    for world in [1, 2, 3, 4] {
        let reference = train(world, ZeroStage::Zero0, 12, 1);
        // The comparison means something only if training moved the parameters.
        assert!(reference.grad_norms.iter().all(|&n| n > 0.0));
        assert_ne!(reference.losses[0], reference.losses[STEPS - 1]);
        for stage in [ZeroStage::Zero1, ZeroStage::Zero2, ZeroStage::Zero3] {
            let run = train(world, stage, 12, 1);
            assert_same_bits(
                &reference,
                &run,
                &format!("{stage} vs stage 0 at N={world}"),
            );
        }
    }
}

#[test]
fn gradient_accumulation_keeps_stages_equal() {
    let reference = train(2, ZeroStage::Zero0, 8, 2);
    for stage in [ZeroStage::Zero1, ZeroStage::Zero2, ZeroStage::Zero3] {
        let run = train(2, stage, 8, 2);
        assert_same_bits(&reference, &run, &format!("{stage} with 2 micro-steps"));
    }
}

#[test]
fn world_sizes_agree_to_rounding() {
    let one = train(1, ZeroStage::Zero2, 12, 1);
    for world in [2, 3, 4] {
        let run = train(world, ZeroStage::Zero2, 12, 1);
        for (a, b) in one.losses.iter().zip(&run.losses) {
            assert!((a - b).abs() < 1e-4, "N={world}: loss {a} vs {b}");
        }
        let max_diff = one
            .params
            .iter()
            .flatten()
            .zip(run.params.iter().flatten())
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(
            max_diff < 1e-4,
            "N={world}: parameters differ by {max_diff}"
        );
    }
}

#[test]
fn the_first_loss_is_about_ln_vocab() {
    let run = train(2, ZeroStage::Zero3, 4, 1);
    assert!(
        (run.losses[0] - 100f32.ln()).abs() < 0.3,
        "{:?}",
        run.losses
    );
}

#[test]
fn half_precision_stages_give_the_same_bits() {
    for precision in [Precision::Bf16, Precision::Fp16] {
        for world in [2, 3] {
            let reference = train_in(precision, world, ZeroStage::Zero0, 12, 1);
            assert!(reference
                .grad_norms
                .iter()
                .all(|n| n.is_finite() && *n > 0.0));
            for stage in [ZeroStage::Zero1, ZeroStage::Zero2, ZeroStage::Zero3] {
                let run = train_in(precision, world, stage, 12, 1);
                assert_same_bits(
                    &reference,
                    &run,
                    &format!("{precision:?} {stage} vs stage 0 at N={world}"),
                );
            }
        }
    }
}

#[test]
fn half_precision_tracks_fp32() {
    let fp32 = train(2, ZeroStage::Zero2, 12, 1);
    for precision in [Precision::Bf16, Precision::Fp16] {
        let half = train_in(precision, 2, ZeroStage::Zero2, 12, 1);
        for (a, b) in fp32.losses.iter().zip(&half.losses) {
            assert!((a - b).abs() < 0.05, "{precision:?}: loss {b} vs fp32 {a}");
        }
        // Not the same bits: the half types really are in the loop.
        assert_ne!(bits(&fp32.params), bits(&half.params), "{precision:?}");
    }
}

#[test]
fn the_bucket_size_changes_no_bit() {
    for stage in [ZeroStage::Zero0, ZeroStage::Zero2, ZeroStage::Zero3] {
        let at = |bytes: usize| {
            let config = EngineConfig {
                stage,
                reduce_bucket_bytes: bytes,
                ..EngineConfig::default()
            };
            train_with(config, 3, 12, 1)
        };
        // 600 bytes over 3 ranks: 50-element pieces, so every unit is many buckets, with a
        // short last one.
        assert_same_bits(&at(4 << 20), &at(600), &format!("{stage}: bucket size"));
    }
}

/// ZeRO-Offload's update on the host arena gives the bits of the update in the engine's
/// arena, at every stage and precision, with and without gradient accumulation.
#[test]
fn the_offloaded_optimizer_changes_no_bit() {
    for precision in [Precision::Fp32, Precision::Bf16, Precision::Fp16] {
        let reference = train_in(precision, 3, ZeroStage::Zero0, 12, 1);
        for stage in ZeroStage::ALL {
            let config = EngineConfig {
                stage,
                precision,
                offload_optimizer: true,
                ..EngineConfig::default()
            };
            let run = train_with(config, 3, 12, 1);
            let what = format!("{precision:?} {stage} offloaded vs stage 0 at N=3");
            assert_same_bits(&reference, &run, &what);
        }
    }
    let reference = train_in(Precision::Bf16, 2, ZeroStage::Zero0, 8, 2);
    let config = EngineConfig {
        stage: ZeroStage::Zero3,
        precision: Precision::Bf16,
        offload_optimizer: true,
        ..EngineConfig::default()
    };
    assert_same_bits(
        &reference,
        &train_with(config, 2, 8, 2),
        "bf16 stage 3 offloaded, 2 micro-steps",
    );
}

/// With the kept gradients offloaded too (accumulated into the host arena as each bucket
/// lands), every stage and precision trains to the bits of stage 0 without offload: one
/// micro-step, two (the accumulation across micro-steps happens in the host arena), and
/// 600-byte buckets that cut every unit into many pieces.
#[test]
fn offloaded_gradients_change_no_bit() {
    let offloaded = |stage, precision, bucket: usize| EngineConfig {
        stage,
        precision,
        offload_optimizer: true,
        offload_gradients: true,
        reduce_bucket_bytes: bucket,
        ..EngineConfig::default()
    };
    for precision in [Precision::Fp32, Precision::Bf16, Precision::Fp16] {
        let reference = train_in(precision, 3, ZeroStage::Zero0, 12, 1);
        for stage in ZeroStage::ALL {
            let run = train_with(offloaded(stage, precision, 4 << 20), 3, 12, 1);
            let what = format!("{precision:?} {stage} gradients offloaded vs stage 0 at N=3");
            assert_same_bits(&reference, &run, &what);
        }
        let run = train_with(offloaded(ZeroStage::Zero2, precision, 600), 3, 12, 1);
        let what = format!("{precision:?} stage 2 gradients offloaded in 600-byte pieces");
        assert_same_bits(&reference, &run, &what);
    }
    for stage in [ZeroStage::Zero1, ZeroStage::Zero3] {
        let reference = train_in(Precision::Bf16, 2, ZeroStage::Zero0, 8, 2);
        let run = train_with(offloaded(stage, Precision::Bf16, 4 << 20), 2, 8, 2);
        let what = format!("bf16 {stage} gradients offloaded, 2 micro-steps");
        assert_same_bits(&reference, &run, &what);
    }
}

/// The offloaded update moves a unit's owned range in pieces of a gradient bucket: 600-byte
/// buckets cut every unit of the tiny model into many pieces with a short last one, and no
/// bit changes.
#[test]
fn the_offloaded_update_in_pieces_changes_no_bit() {
    for precision in [Precision::Fp32, Precision::Bf16] {
        let reference = train_in(precision, 3, ZeroStage::Zero0, 12, 1);
        for stage in ZeroStage::ALL {
            let config = EngineConfig {
                stage,
                precision,
                offload_optimizer: true,
                reduce_bucket_bytes: 600,
                ..EngineConfig::default()
            };
            let what = format!("{precision:?} {stage} offloaded in 600-byte pieces");
            assert_same_bits(&reference, &train_with(config, 3, 12, 1), &what);
        }
        // Stage 3 with every unit persistent: whole parameters, sharded optimizer states.
        let config = EngineConfig {
            stage: ZeroStage::Zero3,
            precision,
            offload_optimizer: true,
            persistence_threshold: 1 << 30,
            ..EngineConfig::default()
        };
        let what = format!("{precision:?} stage 3, persistent units, offloaded");
        assert_same_bits(&reference, &train_with(config, 3, 12, 1), &what);
    }
}
