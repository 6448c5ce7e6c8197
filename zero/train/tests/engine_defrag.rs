//! The engine's arena compacts itself when stage-3 gathers and releases fragment it, and
//! training reads the same bytes afterwards: losses and parameters equal to the bit to a run
//! whose roomy arena never fragments.
//!
//! The engine sizes its arena from its memory plan (`memory_limit: None`), which budgets a few
//! gathered units at once. This test holds far more: small units are gathered until the
//! arena's largest hole is smaller than one gathered copy of the big unit, every other one is
//! released (holes the size of a small unit between live blocks), and then the big unit is
//! gathered. Its copy fits in no hole though the free total suffices: exactly the case where
//! the arena compacts (`zero_alloc::Arena::alloc`) rather than fail, moving gathered copies and
//! model states alike.

use zero::{Engine, EngineConfig, UnitSpec, ZeroStage};

/// Elements of a small unit: a multiple of N * 128 for N = 1..4, so no unit is padded.
const SMALL: usize = 1536;
/// Elements of the big unit.
const BIG: usize = 4 * SMALL;
/// Bytes of the big unit's gathered f32 copy.
const BIG_BYTES: usize = 4 * BIG;
/// Small units registered; the test gathers as many as fit.
const SMALL_UNITS: usize = 48;
const STEPS: usize = 2;
const ACCUM: usize = 2;

/// Deterministic values in [-0.5, 0.5).
fn values(seed: usize, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((seed * 7919 + i * 104_729) % 1000) as f32 / 1000.0 - 0.5)
        .collect()
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).fold(0.0, |s, (x, y)| s + x * y)
}

/// The big unit's index (after the small ones).
const BIG_UNIT: usize = SMALL_UNITS;

/// The arena just before the big unit was gathered, and whether that gather compacted it.
#[derive(Debug, Clone, Copy)]
struct BigGather {
    largest_free: usize,
    total_free: usize,
    compacted: bool,
}

#[derive(Debug, Default)]
struct Run {
    /// Per micro-step, this rank's loss.
    losses: Vec<f32>,
    big_gathers: Vec<BigGather>,
    /// Every unit's whole parameters at the end.
    params: Vec<Vec<f32>>,
    defrags: u64,
    bytes_moved: u64,
    held: usize,
}

/// A "model" whose loss reads every gathered unit (after the compaction, for the units held
/// across it) and whose gradient depends on the parameters.
fn micro_step(engine: &mut Engine, seed: usize, held: &mut Option<usize>, run: &mut Run) {
    // Hold small units until the largest hole is smaller than the big unit's copy (the first
    // micro-step decides how many; the same number afterwards keeps the unit order fixed).
    let mut count = 0;
    while held.map_or(engine.arena().stats().largest_free >= BIG_BYTES, |k| {
        count < k
    }) {
        engine.gather(count).unwrap();
        count += 1;
    }
    *held = Some(count);
    // Release every other unit, keeping the last one so that no hole joins the tail.
    let released = |u: usize| (count - 1 - u) % 2 == 1;
    let mut loss = 0.0f32;
    for u in (0..count).filter(|&u| released(u)) {
        loss += dot(engine.params(u).unwrap(), &values(seed + u, SMALL));
        engine.release(u).unwrap();
    }
    let before = engine.arena().stats();
    engine.gather(BIG_UNIT).unwrap();
    let after = engine.arena().stats();
    run.big_gathers.push(BigGather {
        largest_free: before.largest_free,
        total_free: before.total_free,
        compacted: after.defrags > before.defrags,
    });
    for u in (0..count).filter(|&u| !released(u)).chain([BIG_UNIT]) {
        let n = engine.params(u).unwrap().len();
        loss += dot(engine.params(u).unwrap(), &values(seed + u, n));
    }
    for u in (0..count).chain([BIG_UNIT]).rev() {
        if u != BIG_UNIT && released(u) {
            engine.gather(u).unwrap();
        }
        engine.begin_backward(u).unwrap();
        let (p, mut g) = engine.views(&[u], &[u]).unwrap();
        let data = values(seed + u + 77, p[0].len());
        for ((g, p), d) in g[0].iter_mut().zip(p[0]).zip(&data) {
            *g = d + 0.5 * p;
        }
        engine.end_backward(u).unwrap();
        engine.release(u).unwrap();
    }
    engine.end_micro_step();
    run.losses.push(loss);
}

/// Trains at stage 3 on `world` ranks with the arena capped at `limit` (None: the plan's
/// size), holding `held` small units (None: as many as fit); returns rank 0's run after
/// checking that every rank ended with the same parameters.
fn train(world: usize, limit: Option<u64>, held: Option<usize>) -> Run {
    let comms = zero_comm::local::create(world).unwrap();
    let runs: Vec<Run> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|comm| {
                s.spawn(move || {
                    let mut units: Vec<UnitSpec> = (0..SMALL_UNITS)
                        .map(|u| UnitSpec::new(format!("small {u}"), SMALL))
                        .collect();
                    units.push(UnitSpec::new("big", BIG));
                    let config = EngineConfig {
                        stage: ZeroStage::Zero3,
                        prefetch_units: 0,
                        memory_limit: limit,
                        ..EngineConfig::default()
                    };
                    let mut engine = Engine::new(comm, units, config, |u, w| {
                        w.copy_from_slice(&values(1000 + u, w.len()));
                    })
                    .unwrap();
                    let rank = engine.rank();
                    let mut run = Run::default();
                    let mut held = held;
                    for step in 0..STEPS {
                        for micro in 0..ACCUM {
                            let seed = ((step * ACCUM + micro) * 4 + rank) * 100;
                            micro_step(&mut engine, seed, &mut held, &mut run);
                        }
                        engine.step(1e-2).unwrap();
                    }
                    let stats = engine.arena().stats();
                    assert_eq!(stats.ooms, 0);
                    run.defrags = stats.defrags;
                    run.bytes_moved = stats.bytes_moved;
                    run.held = held.unwrap_or(0);
                    run.params = zero_train::bridge::full_params(&mut engine).unwrap();
                    run
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for r in &runs[1..] {
        assert_eq!(
            bits(r.params.iter().flatten()),
            bits(runs[0].params.iter().flatten())
        );
    }
    runs.into_iter().next().unwrap()
}

fn bits<'a>(xs: impl IntoIterator<Item = &'a f32>) -> Vec<u32> {
    xs.into_iter().map(|x| x.to_bits()).collect()
}

#[test]
fn a_fragmented_arena_compacts_and_training_reads_the_same_bytes() {
    for world in 1..=4 {
        let tight = train(world, None, None);
        assert!(tight.held > 2, "N={world}: only {} units held", tight.held);
        for (k, g) in tight.big_gathers.iter().enumerate() {
            assert!(
                g.largest_free < BIG_BYTES && BIG_BYTES <= g.total_free,
                "N={world} micro-step {k}: not fragmented as intended: {g:?}"
            );
            assert!(
                g.compacted,
                "N={world} micro-step {k}: no compaction: {g:?}"
            );
        }
        assert!(tight.bytes_moved > 0, "N={world}: compaction moved nothing");

        let roomy = train(world, Some(16 << 20), Some(tight.held));
        assert_eq!(roomy.defrags, 0, "N={world}: the roomy arena compacted");
        assert_eq!(
            bits(&tight.losses),
            bits(&roomy.losses),
            "N={world}: losses"
        );
        assert_eq!(
            bits(tight.params.iter().flatten()),
            bits(roomy.params.iter().flatten()),
            "N={world}: parameters"
        );
    }
}
