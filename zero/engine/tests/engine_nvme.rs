//! The optimizer's file tier (`EngineConfig::optimizer_file`, `--offload-optimizer nvme`):
//! training with the states in a file gives the parameters and states of training with them
//! in the host arena or in the engine's arena, to the bit, at every stage and precision;
//! the host arena holds only the update's staging, exactly as planned; the file is the
//! planned size on disk; a piece larger than the pool's buffer streams through it; and a
//! missing folder or a host cap below one piece is refused at start-up, naming it.

mod common;

use common::tiers::{engine, micro_step, on_ranks, trained, TempDir, SIZES};
use zero::{EngineConfig, Error, Lane, Precision, UnitState, ZeroStage};

/// Where a configuration keeps the optimizer states (and, with `Grads`, the kept gradients
/// beside them in the host arena: `EngineConfig::offload_gradients`).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Home {
    Arena,
    Host,
    File,
    HostGrads,
    FileGrads,
}

/// `stage` and `precision` with the states at `home`, in 2 KiB gradient buckets (pieces of
/// 512 or 1024 elements, so the larger units stream several) and an engine arena with room
/// to spare.
fn config(stage: ZeroStage, precision: Precision, home: Home) -> EngineConfig {
    EngineConfig {
        stage,
        precision,
        reduce_bucket_bytes: 2048,
        offload_optimizer: home != Home::Arena,
        optimizer_file: matches!(home, Home::File | Home::FileGrads),
        offload_gradients: matches!(home, Home::HostGrads | Home::FileGrads),
        memory_limit: Some(1 << 30),
        ..EngineConfig::default()
    }
}

/// Every tier, with the gradients in the engine's arena or offloaded beside the states,
/// trains to the bits of the states in the engine's arena.
#[test]
fn states_in_the_file_train_as_in_the_host_arena_and_the_engines_to_the_bit() {
    let dir = TempDir::new("bits");
    for precision in [Precision::Fp32, Precision::Bf16, Precision::Fp16] {
        for stage in ZeroStage::ALL {
            for world in [1, 2] {
                let what = format!("{precision:?} {stage} N={world}");
                let arena = trained(world, config(stage, precision, Home::Arena), None);
                assert_ne!(arena[0], arena[2], "{what}: training moved nothing");
                let host = trained(world, config(stage, precision, Home::Host), None);
                assert!(host == arena, "{what}: host arena");
                let file = trained(world, config(stage, precision, Home::File), Some(&dir.0));
                assert!(file == arena, "{what}: file");
                let host_grads = trained(world, config(stage, precision, Home::HostGrads), None);
                assert!(
                    host_grads == arena,
                    "{what}: host arena, gradients offloaded"
                );
                let file_grads = config(stage, precision, Home::FileGrads);
                let file_grads = trained(world, file_grads, Some(&dir.0));
                assert!(file_grads == arena, "{what}: file, gradients offloaded");
            }
        }
    }
}

/// Elements of the pieces an update of `owned` elements of a kept range of `kept` moves,
/// `piece` at a time: every piece that starts inside the owned range, whole (the file's
/// pieces cut the kept range, padding included).
fn streamed_elems(owned: usize, kept: usize, piece: usize) -> usize {
    (owned.div_ceil(piece) * piece).min(kept)
}

/// One rank at stage 0 keeps every unit whole (padded to 128 elements), the host arena
/// holds no state, each arena peaks at its plan, the file on disk is the planned size, and
/// one step reads and writes exactly the pieces covering each unit once. With 64 KiB
/// buckets a state's piece (up to 16 KiB here) is larger than the pool's one 4 KiB buffer,
/// which never grows.
#[test]
fn the_file_is_the_planned_size_and_a_piece_larger_than_the_pool_streams_through_it() {
    let dir = TempDir::new("plan");
    for precision in [Precision::Fp32, Precision::Bf16] {
        let config = EngineConfig {
            reduce_bucket_bytes: 64 << 10,
            nvme_chunk_bytes: 4096,
            ..config(ZeroStage::Zero0, precision, Home::File)
        };
        let reference = trained(1, config, Some(&dir.0));
        let cpu = EngineConfig {
            optimizer_file: false,
            ..config
        };
        assert!(reference == trained(1, cpu, None), "{precision:?}");
        on_ranks(1, |c| {
            let mut e = engine(c, config, Some(&dir.0)).unwrap();
            let plan = e.memory_plan().offload.unwrap();
            let host = e.offload_arena().unwrap().stats();
            assert_eq!((host.allocated, plan.states), (0, 0), "{precision:?}");
            let before = e.optimizer_file().unwrap();
            let on_disk = std::fs::metadata(dir.0.join("zero-optimizer-rank0.tier"))
                .unwrap()
                .len();
            assert_eq!((before.file_bytes, on_disk), (plan.file, plan.file));
            // One buffer for the I/O thread, one for the engine's thread.
            assert_eq!((before.chunk_bytes, before.pool_bytes), (4096, 8192));
            assert!(before.largest_piece > before.chunk_bytes, "{before:?}");
            micro_step(&mut e, 1.0).unwrap();
            e.step(1e-2).unwrap();
            let after = e.optimizer_file().unwrap();
            assert_eq!(after.pool_bytes, before.pool_bytes);
            let piece = (64 << 10) / precision.param_bytes() as usize;
            let states = if precision == Precision::Fp32 { 2 } else { 3 };
            let moved: usize = SIZES
                .iter()
                .map(|&n| streamed_elems(n, n.next_multiple_of(128), piece) * 4 * states)
                .sum();
            let read = after.read_bytes - before.read_bytes;
            let written = after.written_bytes - before.written_bytes;
            assert_eq!(
                (read, written),
                (moved as u64, moved as u64),
                "{precision:?}"
            );
            let peak = e.offload_arena().unwrap().stats().peak_allocated as u64;
            assert_eq!(
                peak,
                plan.optimizer_arena(),
                "{precision:?}: host arena peak"
            );
        });
    }
}

/// States imported into an engine with the file tier export as they were imported, and its
/// own shard reads back the same elements.
#[test]
fn imported_states_export_back_from_the_file() {
    let dir = TempDir::new("import");
    let cfg = config(ZeroStage::Zero2, Precision::Bf16, Home::File);
    on_ranks(2, |c| {
        let mut e = engine(c, cfg, Some(&dir.0)).unwrap();
        let states: Vec<UnitState> = SIZES
            .iter()
            .enumerate()
            .map(|(u, &n)| {
                let value = |k: usize| (0..n).map(|i| (i * 7 + u + k) as f32 * 0.25).collect();
                UnitState {
                    params: value(0),
                    m: value(1),
                    v: value(2),
                }
            })
            .collect();
        e.import_states(&states, 5).unwrap();
        assert!(e.export_states().unwrap() == states);
        for (u, state) in states.iter().enumerate() {
            let owned = e.owned_states(u).unwrap();
            assert_eq!(owned.m, state.m[owned.range.clone()], "unit {u}");
            assert_eq!(owned.v, state.v[owned.range.clone()], "unit {u}");
        }
    });
}

/// A message of `err` that the test can read.
fn message(err: Error) -> String {
    err.to_string()
}

#[test]
fn a_missing_folder_or_a_host_cap_below_one_piece_is_refused_at_start_up() {
    let dir = TempDir::new("refuse");
    let cfg = config(ZeroStage::Zero2, Precision::Fp32, Home::File);
    on_ranks(1, |c| {
        let err = message(engine(c, cfg, None).unwrap_err());
        assert!(err.contains("--nvme-path"), "{err}");
    });
    // A path under a regular file: refused for root too, where permission bits do not bite.
    let file = dir.0.join("plain");
    std::fs::write(&file, b"x").unwrap();
    let under = file.join("sub");
    on_ranks(1, |c| {
        let err = message(engine(c, cfg, Some(&under)).unwrap_err());
        assert!(err.contains(&under.display().to_string()), "{err}");
    });
    let plan = on_ranks(1, |c| engine(c, cfg, Some(&dir.0)).unwrap().memory_plan())[0]
        .offload
        .unwrap();
    assert_eq!(plan.states, 0);
    // With the states in the host arena, the cap must hold them too.
    let host = config(ZeroStage::Zero2, Precision::Fp32, Home::Host);
    let total = on_ranks(1, |c| engine(c, host, None).unwrap().memory_plan())[0]
        .offload
        .unwrap()
        .total();
    on_ranks(1, |c| {
        let capped = EngineConfig {
            host_memory_limit: Some(total - 1),
            ..host
        };
        let err = message(engine(c, capped, None).unwrap_err());
        assert!(err.contains(&format!("needs {total} bytes")), "{err}");
    });
    for (limit, fits) in [(plan.staging, true), (plan.staging - 1, false)] {
        let capped = EngineConfig {
            host_memory_limit: Some(limit),
            ..cfg
        };
        on_ranks(1, |c| match engine(c, capped, Some(&dir.0)) {
            Ok(_) => assert!(fits, "{limit}"),
            Err(e) => {
                let err = message(e);
                assert!(!fits, "{limit}: {err}");
                assert!(err.contains("--host-memory-limit"), "{err}");
                assert!(
                    err.contains(&format!("needs {} bytes", plan.staging)),
                    "{err}"
                );
            }
        });
    }
}

/// A traced step with the file tier: each piece the updates cover is read once, before its
/// unit's update ends, and written once, after it starts, all within the step, on the
/// file's lane, their bytes what the file counts as moved; the file's bytes are sampled
/// beside the arenas'.
#[test]
fn a_traced_step_reads_each_piece_before_its_update_ends_and_writes_it_after() {
    let dir = TempDir::new("trace");
    let cfg = config(ZeroStage::Zero0, Precision::Fp32, Home::File);
    on_ranks(1, |c| {
        let mut e = engine(c, cfg, Some(&dir.0)).unwrap();
        let before = e.optimizer_file().unwrap();
        e.start_trace();
        micro_step(&mut e, 1.0).unwrap();
        e.step(1e-2).unwrap();
        let trace = e.take_trace().unwrap();
        let after = e.optimizer_file().unwrap();
        let file: Vec<_> = trace
            .spans
            .iter()
            .filter(|s| s.lane == Lane::File)
            .collect();
        let piece = 2048 / 4;
        let named = |name: &str| {
            let mut found = trace.spans.iter().filter(|s| s.name == name);
            let span = found.next().unwrap_or_else(|| panic!("no span {name}"));
            assert!(found.next().is_none(), "{name} twice");
            span
        };
        let step = named("step 1");
        let pieces: usize = SIZES.iter().map(|n| n.div_ceil(piece)).sum();
        assert_eq!(file.len(), 2 * pieces);
        for (u, &n) in SIZES.iter().enumerate() {
            let update = named(&format!("update unit {u}"));
            for k in 0..n.div_ceil(piece) {
                let read = named(&format!("read unit {u} piece {k}"));
                let write = named(&format!("write unit {u} piece {k}"));
                assert!(
                    step.start <= read.start && read.end <= update.end,
                    "{u} {k}"
                );
                assert!(
                    update.start <= write.start && write.end <= step.end,
                    "{u} {k}"
                );
            }
        }
        let sum = |way: &str| -> u64 {
            let spans = file.iter().filter(|s| s.name.starts_with(way));
            spans.map(|s| s.bytes.unwrap()).sum()
        };
        assert_eq!(sum("read"), after.read_bytes - before.read_bytes);
        assert_eq!(sum("write"), after.written_bytes - before.written_bytes);
        let samples: Vec<_> = trace
            .samples
            .iter()
            .filter(|s| s.name == "file bytes")
            .collect();
        assert!(!samples.is_empty());
        assert!(samples.iter().all(|s| s.value == after.file_bytes));
    });
}

/// A file cut short under a running engine fails the step with the file's path and its
/// expected length, and the update gives back every staging block (none stays lent).
#[test]
fn a_file_cut_short_fails_the_step_naming_it_and_frees_the_staging() {
    let dir = TempDir::new("short");
    let cfg = config(ZeroStage::Zero0, Precision::Fp32, Home::File);
    on_ranks(1, |c| {
        let mut e = engine(c, cfg, Some(&dir.0)).unwrap();
        let path = dir.0.join("zero-optimizer-rank0.tier");
        let expected = e.optimizer_file().unwrap().file_bytes;
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(expected / 2)
            .unwrap();
        micro_step(&mut e, 1.0).unwrap();
        let err = message(e.step(1e-2).unwrap_err());
        assert!(err.contains(&path.display().to_string()), "{err}");
        assert!(err.contains(&format!("expected {expected}")), "{err}");
        assert_eq!(e.offload_arena().unwrap().stats().allocated, 0);
    });
}
