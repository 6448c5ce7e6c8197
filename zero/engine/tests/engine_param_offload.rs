//! ZeRO-Infinity's parameter offload (`EngineConfig::offload_params`, `--offload-params`): at
//! stage 3 the gathered units' stored shards live in a host arena of their own or in the
//! rank's parameter file, and training gives the parameters and states of training with
//! them in the engine's arena, to the bit, in every precision, with and without prefetch;
//! every tier holds exactly what the plan says; and a configuration that cannot run is
//! refused at start-up, naming what it needs.

mod common;

use common::tiers::{engine, micro_step, on_ranks, trained, TempDir, SIZES};
use std::path::Path;
use zero::{EngineConfig, Error, Lane, Precision, ZeroStage};

/// Where a configuration keeps the optimizer states and the parameter shards.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Tier {
    Arena,
    Host,
    File,
}

/// Stage 3 in `precision` with the optimizer states at `optim` (never the arena: parameter
/// offload needs the optimizer offloaded) and the shards at `params`, 2 KiB buckets (so the
/// 4096-element unit's shard spans several file pieces), unit 1 (7 elements) kept whole.
fn config(precision: Precision, optim: Tier, params: Tier) -> EngineConfig {
    EngineConfig {
        stage: ZeroStage::Zero3,
        precision,
        reduce_bucket_bytes: 2048,
        persistence_threshold: 8,
        offload_optimizer: true,
        optimizer_file: optim == Tier::File,
        offload_params: params != Tier::Arena,
        params_file: params == Tier::File,
        ..EngineConfig::default()
    }
}

fn dir_for(c: &EngineConfig, dir: &Path) -> Option<std::path::PathBuf> {
    (c.optimizer_file || c.params_file).then(|| dir.to_path_buf())
}

#[test]
fn offloaded_parameters_train_as_in_the_arena_to_the_bit() {
    let dir = TempDir::new("params-bits");
    for precision in [Precision::Fp32, Precision::Bf16, Precision::Fp16] {
        for world in [1, 2] {
            for prefetch_units in [0, 1] {
                let what = format!("{precision:?} N={world} prefetch {prefetch_units}");
                let with = |c: EngineConfig| EngineConfig {
                    prefetch_units,
                    ..c
                };
                let reference = trained(
                    world,
                    with(config(precision, Tier::Host, Tier::Arena)),
                    None,
                );
                assert_ne!(reference[0], reference[2], "{what}: training moved nothing");
                for (optim, params) in [
                    (Tier::Host, Tier::Host),
                    (Tier::Host, Tier::File),
                    (Tier::File, Tier::Host),
                    (Tier::File, Tier::File),
                ] {
                    let c = with(config(precision, optim, params));
                    let got = trained(world, c, dir_for(&c, &dir.0).as_deref());
                    assert!(
                        got == reference,
                        "{what}: optimizer {optim:?}, params {params:?}"
                    );
                }
            }
        }
    }
}

/// Bytes of a shard of `n` elements of `elem` bytes over `world` ranks, as the arena and
/// the file hold it: shards are multiples of 128 elements, blocks of 256 bytes.
fn shard_bytes(n: usize, world: usize, elem: usize) -> u64 {
    let shard = n.div_ceil(world).next_multiple_of(128);
    ((shard * elem).next_multiple_of(256)) as u64
}

/// A shard's block among the reads ahead: whole 4 KiB blocks, so the file's direct I/O
/// reads into it without a copy.
fn read_ahead_bytes(n: usize, world: usize, elem: usize) -> u64 {
    let shard = n.div_ceil(world).next_multiple_of(128);
    ((shard * elem).next_multiple_of(4096)) as u64
}

#[test]
fn every_tier_holds_what_the_plan_says_and_the_arena_no_offloaded_shard() {
    let dir = TempDir::new("params-plan");
    for precision in [Precision::Fp32, Precision::Bf16] {
        let elem = precision.param_bytes() as usize;
        // Units 0, 2 and 3 are gathered; unit 1 is under the persistence threshold.
        let gathered: u64 = [0, 2, 3]
            .map(|u| shard_bytes(SIZES[u], 2, elem))
            .iter()
            .sum();
        let host = config(precision, Tier::Host, Tier::Host);
        let peaks = on_ranks(2, |c| {
            let mut e = engine(c, host, None).unwrap();
            micro_step(&mut e, 1e-3).unwrap();
            e.step(1e-2).unwrap();
            let plan = e.memory_plan();
            let offload = plan.offload.unwrap();
            let params_arena = e.offload_params_arena().unwrap().stats();
            let measured = e.measured_model_state_bytes().unwrap().params;
            (
                (offload.params, params_arena.peak_allocated as u64),
                (e.offloaded_param_bytes().unwrap(), measured),
                (plan.total(), e.arena().stats().peak_allocated as u64),
                plan.model_states.params,
            )
        });
        for (shards, measured, arena, planned_in_arena) in peaks {
            assert_eq!(shards, (gathered, gathered), "{precision:?}: host shards");
            assert_eq!(measured.0, gathered, "{precision:?}");
            // Only unit 1, kept whole and padded to 128 elements a rank, stays in the arena;
            // the measured bytes count the shards in their home too.
            let whole = (2 * 128 * elem) as f64;
            assert_eq!(planned_in_arena, whole, "{precision:?}");
            assert_eq!(measured.1, whole + gathered as f64, "{precision:?}");
            assert_eq!(arena.0, arena.1, "{precision:?}: engine arena peak");
        }
        let file = config(precision, Tier::Host, Tier::File);
        on_ranks(2, |c| {
            let rank = c.rank();
            let mut e = engine(c, file, Some(&dir.0)).unwrap();
            let offload = e.memory_plan().offload.unwrap();
            assert_eq!(offload.params, 0);
            assert!(e.offload_params_arena().is_none());
            let path = dir.0.join(format!("zero-params-rank{rank}.tier"));
            let on_disk = std::fs::metadata(&path).unwrap().len();
            let (named, stats) = e.params_file().unwrap();
            assert_eq!(named, path.as_path());
            assert_eq!(
                (stats.file_bytes, on_disk),
                (offload.params_file, offload.params_file)
            );
            // The header's 4096 bytes, then each piece in a 4096-byte slot.
            assert!(offload.params_file >= 4096 + gathered, "{precision:?}");
            micro_step(&mut e, 1e-3).unwrap();
            e.step(1e-2).unwrap();
            let moved = e.params_file().unwrap().1;
            // Every shard written at start-up and by the update; read by the forward's
            // gathers at least.
            assert_eq!(moved.written_bytes, 2 * gathered, "{precision:?}");
            assert!(moved.read_bytes >= gathered, "{moved:?}");
        });
    }
}

fn message(err: Error) -> String {
    err.to_string()
}

#[test]
fn a_configuration_parameter_offload_cannot_run_is_refused_at_start_up() {
    let dir = TempDir::new("params-refused");
    let base = config(Precision::Fp32, Tier::Host, Tier::Host);
    let cases = [
        (
            EngineConfig {
                stage: ZeroStage::Zero2,
                ..base
            },
            None,
            "needs stage 3",
        ),
        (
            EngineConfig {
                offload_optimizer: false,
                ..base
            },
            None,
            "--offload-optimizer",
        ),
        (
            config(Precision::Fp32, Tier::Host, Tier::File),
            None,
            "--nvme-path",
        ),
    ];
    for (c, path, want) in cases {
        let got = on_ranks(1, |comm| engine(comm, c, path).map(|_| ()).unwrap_err());
        let text = message(got.into_iter().next().unwrap());
        assert!(text.contains(want), "{text}");
    }
    // A host cap below the shards and the optimizer's staging names the bytes needed.
    let capped = EngineConfig {
        host_memory_limit: Some(1024),
        ..base
    };
    let got = on_ranks(1, |comm| {
        engine(comm, capped, None).map(|_| ()).unwrap_err()
    });
    let text = message(got.into_iter().next().unwrap());
    assert!(text.contains("1024"), "{text}");
    drop(dir);
}

/// A checkpoint's whole states imported into an engine whose shards are in a file export
/// back unchanged, and the next step from them gives what an engine holding them in its
/// arena gives.
#[test]
fn states_imported_into_offloaded_parameters_export_back_and_train_on() {
    let dir = TempDir::new("params-import");
    for precision in [Precision::Fp32, Precision::Bf16] {
        let resident = config(precision, Tier::Host, Tier::Arena);
        let filed = config(precision, Tier::File, Tier::File);
        let saved = on_ranks(2, |c| {
            let mut e = engine(c, resident, None).unwrap();
            micro_step(&mut e, 1e-3).unwrap();
            e.step(1e-2).unwrap();
            e.export_states().unwrap()
        })
        .swap_remove(0);
        let resume = |config: EngineConfig, path: Option<&Path>| {
            on_ranks(2, |c| {
                let mut e = engine(c, config, path).unwrap();
                e.import_states(&saved, 1).unwrap();
                let back = e.export_states().unwrap();
                micro_step(&mut e, 2e-3).unwrap();
                e.step(1e-2).unwrap();
                (back, e.export_states().unwrap())
            })
            .swap_remove(0)
        };
        let (back, next) = resume(filed, Some(&dir.0));
        assert!(back == saved, "{precision:?}: exported back");
        let (_, reference) = resume(resident, None);
        assert_ne!(reference, saved, "{precision:?}: the step moved nothing");
        assert!(
            next == reference,
            "{precision:?}: the step after the import"
        );
    }
}

/// The parameter file with a look-ahead budget of `budget` bytes.
fn file_with_budget(precision: Precision, budget: usize) -> EngineConfig {
    EngineConfig {
        nvme_prefetch_bytes: budget,
        ..config(precision, Tier::File, Tier::File)
    }
}

/// A budget smaller than any shard reads each shard alone, never refusing one, and trains
/// to the bit as the arena does.
#[test]
fn a_budget_below_one_shard_reads_each_shard_alone_and_trains_to_the_bit() {
    let dir = TempDir::new("params-small-budget");
    for precision in [Precision::Fp32, Precision::Bf16, Precision::Fp16] {
        for world in [1, 2] {
            for prefetch_units in [0, 1] {
                let what = format!("{precision:?} N={world} prefetch {prefetch_units}");
                let reference = trained(
                    world,
                    EngineConfig {
                        prefetch_units,
                        ..config(precision, Tier::Host, Tier::Arena)
                    },
                    None,
                );
                for budget in [0, 100] {
                    let c = EngineConfig {
                        prefetch_units,
                        ..file_with_budget(precision, budget)
                    };
                    let got = trained(world, c, Some(&dir.0));
                    assert!(got == reference, "{what}: budget {budget}");
                }
            }
        }
    }
}

/// The reads ahead hold no more than the plan's bytes: the budget, or the largest shard
/// when the budget is smaller, or every shard when they take less; a budget over every
/// shard reads them all ahead at once.
#[test]
fn the_reads_ahead_never_hold_more_than_the_planned_budget() {
    let dir = TempDir::new("params-budget");
    let elem = 4;
    let shards = [0, 2, 3].map(|u| read_ahead_bytes(SIZES[u], 2, elem));
    let (largest, every) = (shards[1], shards.iter().sum::<u64>());
    let cases = [
        (100, largest),
        (largest as usize, largest),
        ((largest + shards[0]) as usize, largest + shards[0]),
        (zero::DEFAULT_NVME_PREFETCH_BYTES, every),
    ];
    for (budget, planned) in cases {
        let c = file_with_budget(Precision::Fp32, budget);
        on_ranks(2, |comm| {
            let mut e = engine(comm, c, Some(&dir.0)).unwrap();
            let offload = e.memory_plan().offload.unwrap();
            assert_eq!(offload.params_read_ahead, planned, "budget {budget}");
            assert_eq!(
                offload.total(),
                offload.optimizer_arena() + planned,
                "budget {budget}: the host cap counts the reads ahead"
            );
            for step in 0..2 {
                micro_step(&mut e, 1e-3 * (1.0 + step as f32)).unwrap();
                let left = e.params_read_ahead_arena().unwrap().stats().allocated;
                assert_eq!(left, 0, "budget {budget}: the program left a read ahead");
                e.step(1e-2).unwrap();
            }
            let stats = e.params_read_ahead_arena().unwrap().stats();
            let peak = stats.peak_allocated as u64;
            assert!(peak > 0, "budget {budget}: nothing was read ahead");
            assert!(peak <= planned, "budget {budget}: peak {peak} > {planned}");
            assert_eq!(stats.capacity as u64, planned, "budget {budget}");
            // What is held after the step is read for the program's next run, sent during
            // the update.
            assert!(
                stats.allocated > 0,
                "budget {budget}: nothing read for the next run"
            );
            if budget == zero::DEFAULT_NVME_PREFETCH_BYTES {
                assert_eq!(peak, every, "every shard read ahead at once");
            }
        });
    }
}

/// A micro-step whose forward takes 10 ms per unit, so that reads on another thread can be
/// seen to run during it.
fn slow_micro_step(e: &mut zero::Engine) {
    let mut model = common::FnModel::new(
        |&(back, _): &(bool, usize), units: &mut zero::OpUnits<'_>| {
            if back {
                let (p, mut g) = units.views()?;
                for (g, p) in g[0].iter_mut().zip(p[0]) {
                    *g = p * 1e-3;
                }
            } else {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Ok(())
        },
    );
    e.micro_step(&common::tiers::program(), &mut model).unwrap();
}

/// The timeline of two steps of [`slow_micro_step`] with both tiers in files under `dir`,
/// the reads ahead within `budget`, and no all-gather prefetch.
fn two_traced_slow_steps(comm: zero_comm::Communicator, budget: usize, dir: &Path) -> zero::Trace {
    let c = EngineConfig {
        prefetch_units: 0,
        ..file_with_budget(Precision::Fp32, budget)
    };
    let mut e = engine(comm, c, Some(dir)).unwrap();
    e.start_trace();
    for _ in 0..2 {
        slow_micro_step(&mut e);
        e.step(1e-2).unwrap();
    }
    e.take_trace().unwrap()
}

/// On traced steps without the all-gather prefetch, the file's read of each gathered unit
/// (its first span on the file lane) starts before the forward of the unit before it ends:
/// the reads run ahead on the I/O thread, during compute, where reads on the engine's
/// thread would start only at the unit's own gather; and no read of a unit overlaps that
/// unit's update (its write).
#[test]
fn traced_reads_of_the_parameter_file_run_ahead_during_compute() {
    let dir = TempDir::new("params-overlap");
    for budget in [100, zero::DEFAULT_NVME_PREFETCH_BYTES] {
        on_ranks(1, |comm| {
            let trace = two_traced_slow_steps(comm, budget, &dir.0);
            let named = |name: String| -> Vec<&zero::Span> {
                trace.spans.iter().filter(|s| s.name == name).collect()
            };
            for u in [2, 3] {
                let reads: Vec<_> = trace
                    .spans
                    .iter()
                    .filter(|s| s.lane == Lane::File && s.name.ends_with(&format!("unit {u}")))
                    .collect();
                assert!(!reads.is_empty(), "budget {budget}: unit {u} never read");
                let before = named(format!("{:?}", (false, u - 1)));
                assert_eq!(before.len(), 2, "budget {budget}: a forward per step");
                assert!(
                    reads[0].start < before[0].end,
                    "budget {budget}: unit {u}'s read waited for unit {}'s forward",
                    u - 1
                );
                let updates = named(format!("update unit {u}"));
                assert_eq!(updates.len(), 2);
                for (read, update) in reads
                    .iter()
                    .flat_map(|r| updates.iter().map(move |w| (r, w)))
                {
                    assert!(
                        read.end <= update.start || update.end <= read.start,
                        "budget {budget}: unit {u}'s read overlaps its update"
                    );
                }
            }
            let read_ahead = trace
                .spans
                .iter()
                .filter(|s| s.name.starts_with("read params"));
            assert!(read_ahead.count() >= 6, "budget {budget}: reads ahead");
        });
    }
}

/// The update writes the shards in unit order, and once a unit's shard is written its read
/// for the program's next run is sent: on two traced steps, a read of unit 0 (the forward's
/// first gather) starts after the first step's update of unit 0 and before its update of
/// the last unit ends, where a read sent by the next run's first fetch would start only
/// after the whole update.
#[test]
fn the_next_runs_first_reads_start_during_the_update() {
    let dir = TempDir::new("params-next-run");
    on_ranks(1, |comm| {
        let trace = two_traced_slow_steps(comm, zero::DEFAULT_NVME_PREFETCH_BYTES, &dir.0);
        let first = |name: String| {
            let span = trace.spans.iter().find(|s| s.name == name);
            span.unwrap_or_else(|| panic!("no span {name}")).clone()
        };
        let (unit0, last) = (first("update unit 0".into()), first("update unit 3".into()));
        let during = trace.spans.iter().filter(|s| {
            s.name == "read params unit 0" && s.start >= unit0.end && s.start < last.end
        });
        assert_eq!(
            during.count(),
            1,
            "unit 0's read did not start during the update"
        );
    });
}
