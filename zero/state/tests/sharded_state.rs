//! Sharded training states at the engine level: every rank writes only what it owns, the
//! pieces hold each element once, and a state saved at one world size and stage loads at
//! any other to the same parameters and Adam moments, bit for bit. The reference is the
//! engine's whole-unit export (an all-gather), which shares no code with the piece files.

use std::path::{Path, PathBuf};
use zero::{Engine, EngineConfig, Precision, UnitSpec, UnitState, ZeroStage};
use zero_state::{finish_save, load_sharded, save_sharded, start_save, ShardedReader, LATEST};

/// Unit sizes chosen so that shards pad (not multiples of 128 x 4) and one unit is smaller
/// than a shard (ranks past the first own nothing of it).
const SIZES: [usize; 3] = [1000, 300, 5];

fn temp_dir(tag: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("zero-sharded-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    std::fs::create_dir_all(&p).unwrap();
    p
}

fn units() -> Vec<UnitSpec> {
    SIZES
        .iter()
        .enumerate()
        .map(|(i, &n)| UnitSpec::new(format!("u{i}"), n))
        .collect()
}

/// SplitMix64's next draw, as a value in [-2, 2) with 53 random bits.
fn next(state: &mut u64) -> f64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 51) as f64 - 2.0
}

/// Seeded whole states with distinct values everywhere (moments positive like Adam's v).
fn reference_states(seed: u64) -> Vec<UnitState> {
    let mut rng = seed;
    let mut draw = |n: usize, f: &mut dyn FnMut(f64) -> f64| -> Vec<f32> {
        (0..n).map(|_| f(next(&mut rng)) as f32).collect()
    };
    SIZES
        .iter()
        .map(|&n| UnitState {
            params: draw(n, &mut |x| x),
            m: draw(n, &mut |x| 0.01 * x),
            v: draw(n, &mut |x| 1e-4 * x * x),
        })
        .collect()
}

/// Runs `f` on every rank of a local group of `world` ranks; returns the results by rank.
fn on_ranks<T: Send>(
    world: usize,
    stage: ZeroStage,
    precision: Precision,
    f: impl Fn(&mut Engine) -> T + Sync,
) -> Vec<T> {
    let comms = zero_comm::local::create(world).unwrap();
    let config = EngineConfig {
        stage,
        precision,
        ..EngineConfig::default()
    };
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|comm| {
                let f = &f;
                s.spawn(move || {
                    // No program runs, but import and export plan on a whole unit at a time,
                    // which a sequential model's program makes room for.
                    let program = zero::Schedule::sequential(SIZES.len());
                    let mut engine =
                        Engine::new(comm, units(), &[&program], config, |_, w| w.fill(0.5))
                            .unwrap();
                    f(&mut engine)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn bits(states: &[UnitState]) -> Vec<Vec<u32>> {
    states
        .iter()
        .flat_map(|s| [&s.params, &s.m, &s.v])
        .map(|xs| xs.iter().map(|x| x.to_bits()).collect())
        .collect()
}

/// Saves `states` at (`world`, `stage`) into `save` as step 7.
fn save_at(save: &Path, world: usize, stage: ZeroStage, precision: Precision) {
    let states = reference_states(42);
    on_ranks(world, stage, precision, |engine| {
        engine.import_states(&states, 5).unwrap();
        save_sharded(engine, save, 7, serde_json::json!({"note": "test"}), 0).unwrap();
    });
}

/// Loads `dir` at (`world`, `stage`) and returns every rank's whole export.
fn load_at(
    dir: &Path,
    world: usize,
    stage: ZeroStage,
    precision: Precision,
) -> Vec<Vec<UnitState>> {
    on_ranks(world, stage, precision, |engine| {
        load_sharded(dir, engine).unwrap();
        engine.export_states().unwrap()
    })
}

fn round_trip(from: (usize, ZeroStage), to: &[(usize, ZeroStage)], precision: Precision) {
    let save = temp_dir(&format!("rt{}{}{precision:?}", from.0, from.1 as u8));
    save_at(&save, from.0, from.1, precision);
    let expected = bits(&reference_states(42));
    for &(world, stage) in to {
        for (rank, got) in load_at(&save, world, stage, precision).iter().enumerate() {
            assert_eq!(bits(got), expected, "N_d={world} {stage} rank {rank}");
        }
    }
    std::fs::remove_dir_all(save).ok();
}

#[test]
fn four_ranks_stage_three_load_at_two_ranks_stage_one_and_one_rank_stage_zero_bit_for_bit() {
    round_trip(
        (4, ZeroStage::Zero3),
        &[
            (2, ZeroStage::Zero1),
            (1, ZeroStage::Zero0),
            (4, ZeroStage::Zero3),
        ],
        Precision::Fp32,
    );
}

#[test]
fn one_rank_stage_zero_loads_at_four_ranks_stage_three_and_three_ranks_stage_two() {
    round_trip(
        (1, ZeroStage::Zero0),
        &[(4, ZeroStage::Zero3), (3, ZeroStage::Zero2)],
        Precision::Fp32,
    );
}

#[test]
fn bf16_master_weights_move_between_world_sizes_bit_for_bit() {
    round_trip(
        (4, ZeroStage::Zero2),
        &[
            (2, ZeroStage::Zero3),
            (2, ZeroStage::Zero1),
            (1, ZeroStage::Zero0),
        ],
        Precision::Bf16,
    );
}

#[test]
fn every_rank_writes_only_its_own_shard_and_the_pieces_hold_each_element_once() {
    let save = temp_dir("once");
    save_at(&save, 4, ZeroStage::Zero1, Precision::Fp32);
    let dir = save.join("step-000007");
    let reader = ShardedReader::open(&dir).unwrap();
    let m = reader.manifest();
    assert_eq!(
        (m.step, m.partitioning.world, m.partitioning.stage),
        (7, 4, 1)
    );
    let total: usize = SIZES.iter().sum();
    // Bytes on disk: parameters, m and v of every element, once (f32).
    let bytes: u64 = m.files.iter().map(|f| f.bytes).sum();
    assert_eq!(bytes, 3 * 4 * total as u64);
    for (rank, f) in m.files.iter().enumerate() {
        let on_disk = std::fs::metadata(dir.join(&f.name)).unwrap().len();
        assert_eq!(on_disk, f.bytes);
        // Shards are 128-element aligned: 1000 -> 4 x 256, 300 -> 4 x 128, 5 -> 4 x 128.
        let owned: u64 = [(1000u64, 256u64), (300, 128), (5, 128)]
            .iter()
            .map(|&(n, shard)| {
                n.min(shard * (rank as u64 + 1))
                    .saturating_sub(shard * rank as u64)
            })
            .sum();
        assert_eq!(f.bytes, 3 * 4 * owned, "rank {rank}");
    }
    assert!(!save.join("step-000007.partial").exists());
    assert_eq!(
        std::fs::read_to_string(save.join(LATEST)).unwrap(),
        "step-000007\n"
    );
    std::fs::remove_dir_all(save).ok();
}

#[test]
fn a_background_save_that_fails_is_reported_by_finish_and_publishes_nothing() {
    let save = temp_dir("async-fail");
    let partial = save.join("step-000003.partial");
    let results = on_ranks(1, ZeroStage::Zero2, Precision::Fp32, |engine| {
        engine.import_states(&reference_states(1), 1).unwrap();
        let pending = start_save(engine, &save, 3, serde_json::json!({}), 0, true).unwrap();
        // Replace the folder the background thread writes into by a file: its next create
        // fails, or (if it had finished) rank 0's merge of the indexes does.
        while std::fs::remove_dir_all(&partial).is_err() {}
        std::fs::write(&partial, b"not a folder").unwrap();
        finish_save(engine, pending).map(|_| ())
    });
    let err = results.into_iter().next().unwrap().unwrap_err();
    assert!(err.to_string().contains("step-000003.partial"), "{err}");
    assert!(!save.join("step-000003").exists());
    assert!(!save.join(LATEST).exists());
    std::fs::remove_dir_all(save).ok();
}

#[test]
fn a_background_save_writes_the_same_pieces_as_a_foreground_one() {
    let (fg, bg) = (temp_dir("fg"), temp_dir("bg"));
    let states = reference_states(9);
    on_ranks(2, ZeroStage::Zero3, Precision::Fp32, |engine| {
        engine.import_states(&states, 2).unwrap();
        save_sharded(engine, &fg, 1, serde_json::json!({}), 0).unwrap();
        let pending = start_save(engine, &bg, 1, serde_json::json!({}), 0, true).unwrap();
        // Training goes on meanwhile: the snapshot, not the engine, is written.
        engine.import_states(&reference_states(10), 3).unwrap();
        finish_save(engine, pending).unwrap();
    });
    for rank in 0..2 {
        let name = format!("step-000001/rank-0000{rank}.bin");
        assert!(std::fs::read(fg.join(&name)).unwrap() == std::fs::read(bg.join(&name)).unwrap());
    }
    std::fs::remove_dir_all(fg).ok();
    std::fs::remove_dir_all(bg).ok();
}

/// A foreground save reads each rank's owned ranges where they live: the rank's arena makes no
/// allocation for it at any stage, so its peak does not rise at all (the issue allows one
/// unit). `--async-save`'s snapshot is a host copy outside the arena (docs/checkpoints.md).
#[test]
fn a_save_allocates_nothing_in_the_arena() {
    for stage in [
        ZeroStage::Zero0,
        ZeroStage::Zero1,
        ZeroStage::Zero2,
        ZeroStage::Zero3,
    ] {
        let save = temp_dir(&format!("peak{}", stage as u8));
        let states = reference_states(9);
        let deltas = on_ranks(2, stage, Precision::Bf16, |engine| {
            engine.import_states(&states, 3).unwrap();
            let before = engine.arena().stats();
            save_sharded(engine, &save, 3, serde_json::json!({}), 0).unwrap();
            let after = engine.arena().stats();
            (
                after.allocs - before.allocs,
                after.peak_allocated - before.peak_allocated,
            )
        });
        for (rank, delta) in deltas.into_iter().enumerate() {
            assert_eq!(
                delta,
                (0, 0),
                "{stage} rank {rank}: (allocations, peak rise)"
            );
        }
        std::fs::remove_dir_all(save).ok();
    }
}
