//! The engine's timeline: every operation of a micro-step recorded once, in program order,
//! without overlap; each offloaded kept input copied out and back once, its fetch landed
//! before the operation that restores it starts; at stage 3 over two ranks each unit's
//! reduction once and each prefetch landed before its unit is read, some of them in flight
//! across an operation; and the Chrome trace document holds every span and sample with
//! times from the earliest one.

#[path = "../examples/mlp/model.rs"]
#[allow(dead_code)]
mod model;

use model::{init, micro_batch, Mlp, MlpOp, Shape};
use zero::{
    chrome_trace, Engine, EngineConfig, Lane, Program, Trace, ZeroStage, SHARD_ALIGN_ELEMS,
};

const SHAPE: Shape = Shape {
    inputs: 6,
    hidden: 16,
    classes: 3,
    blocks: 4,
    batch: 4,
};
const EVERY: Option<usize> = Some(1);

/// Rank `comm`'s timeline of one micro-step of `train` (checkpointing every `every` blocks
/// or none) and one optimizer step, under `config`.
fn trace_one_step(
    comm: zero_comm::Communicator,
    train: &Program<MlpOp>,
    every: Option<usize>,
    config: EngineConfig,
) -> Trace {
    let rank = comm.rank();
    let mut e = Engine::new(comm, SHAPE.units(), &[train.schedule()], config, |u, w| {
        init(&SHAPE, u, w)
    })
    .unwrap();
    let mut mlp = Mlp::new(SHAPE, every, vec![], vec![]);
    let (x, y) = micro_batch(&SHAPE, 0, rank, 0);
    mlp.set_batch(x, y);
    e.start_trace();
    e.micro_step(train, &mut mlp).unwrap();
    e.step(1e-3).unwrap();
    e.take_trace().unwrap()
}

fn traced_step() -> (Trace, Vec<String>, Vec<(usize, usize)>) {
    let comm = zero_comm::local::create(1).unwrap().remove(0);
    let train = SHAPE.train_program(EVERY);
    let config = EngineConfig {
        stage: ZeroStage::Zero3,
        kept_inputs: SHAPE.kept_inputs(true),
        ..EngineConfig::default()
    };
    let trace = trace_one_step(comm, &train, EVERY, config);
    let names = train
        .ops()
        .iter()
        .map(|op| format!("{:?}", op.kind))
        .collect();
    // (restoring operation's index, kept input) for every restore.
    let restores = train
        .ops()
        .iter()
        .enumerate()
        .filter_map(|(i, op)| op.restores.map(|k| (i, k)))
        .collect();
    (trace, names, restores)
}

#[test]
fn every_operation_once_in_order_and_every_fetch_lands_before_its_restore() {
    let (trace, names, restores) = traced_step();
    let ops: Vec<_> = trace
        .spans
        .iter()
        .filter(|s| s.lane == Lane::Compute)
        .collect();
    let got: Vec<&str> = ops.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(got, names);
    for pair in ops.windows(2) {
        assert!(
            pair[0].end <= pair[1].start,
            "{} overlaps {}",
            pair[0].name,
            pair[1].name
        );
    }
    // Blocks 0-2 start recomputed segments (every 1, 4 blocks): 3 kept inputs of B x H f32.
    let copies: Vec<_> = trace
        .spans
        .iter()
        .filter(|s| s.lane == Lane::Copy)
        .collect();
    assert_eq!(copies.len(), 2 * 3);
    let bytes = (SHAPE.batch * SHAPE.hidden * 4) as u64;
    assert!(copies
        .iter()
        .all(|c| c.bytes == Some(bytes) && c.start <= c.end));
    for (op, k) in restores {
        let back = format!("kept input {k} from host");
        let fetch = copies.iter().find(|c| c.name == back).expect("fetched");
        assert!(
            fetch.end <= ops[op].start,
            "{back} landed after {} began",
            ops[op].name
        );
    }
    assert!(trace
        .samples
        .iter()
        .all(|s| s.name == "arena bytes" && s.value > 0));
}

#[test]
fn the_chrome_document_holds_every_span_and_sample_from_time_zero() {
    let (trace, _, _) = traced_step();
    let doc = chrome_trace(&[(0, &trace), (1, &trace)]);
    let events = doc["traceEvents"].as_array().unwrap();
    let count = |ph: &str| events.iter().filter(|e| e["ph"] == ph).count();
    let flights = trace
        .spans
        .iter()
        .filter(|s| s.lane == Lane::Collective)
        .count();
    assert_eq!(count("X"), 2 * (trace.spans.len() - flights));
    assert_eq!((count("b"), count("e")), (2 * flights, 2 * flights));
    assert_eq!(count("C"), 2 * trace.samples.len());
    // Per rank: its process name and one name per lane (6 lanes).
    assert_eq!(count("M"), 2 * 7);
    let ts: Vec<f64> = events
        .iter()
        .filter(|e| e["ph"] == "X")
        .map(|e| e["ts"].as_f64().unwrap())
        .collect();
    assert!(ts.iter().all(|&t| t >= 0.0));
    assert!(ts.contains(&0.0), "times count from the earliest event");
    assert!(events
        .iter()
        .filter(|e| e["ph"] == "X")
        .all(|e| e["dur"].as_f64().unwrap() >= 0.0));
    assert_eq!(chrome_trace(&[])["traceEvents"], serde_json::json!([]));
}

/// Rank 0's timeline of one stage-3 micro-step and step over two ranks, one unit
/// prefetched, no checkpointing; with the program's operations.
fn traced_stage3_on_two_ranks() -> (Trace, Vec<zero::Op<model::MlpOp>>) {
    let train = SHAPE.train_program(None);
    let config = EngineConfig {
        stage: ZeroStage::Zero3,
        prefetch_units: 1,
        ..EngineConfig::default()
    };
    let comms = zero_comm::local::create(2).unwrap();
    let traces: Vec<Trace> = std::thread::scope(|s| {
        let runs: Vec<_> = comms
            .into_iter()
            .map(|comm| {
                let train = &train;
                s.spawn(move || trace_one_step(comm, train, None, config))
            })
            .collect();
        runs.into_iter().map(|r| r.join().unwrap()).collect()
    });
    (traces[0].clone(), train.ops().to_vec())
}

#[test]
fn each_reduction_once_and_each_prefetch_landed_before_its_unit_is_read() {
    let (trace, ops) = traced_stage3_on_two_ranks();
    let of = |lane| trace.spans.iter().filter(move |s| s.lane == lane);
    let compute: Vec<_> = of(Lane::Compute).collect();
    assert_eq!(compute.len(), ops.len());
    // A unit's f32 block, two shards each rounded up to SHARD_ALIGN_ELEMS: its reduction's
    // and its gather's bytes (4 MiB buckets hold every unit of this shape whole).
    let units = SHAPE.units();
    let shard =
        |u: usize| units[u].numel.div_ceil(2).div_ceil(SHARD_ALIGN_ELEMS) * SHARD_ALIGN_ELEMS;
    let bytes = |u: usize| (shard(u) * 2 * 4) as u64;
    let mut reduced: Vec<usize> = Vec::new();
    let mut gathers = 0;
    for flight in of(Lane::Collective) {
        let (what, unit) = flight
            .name
            .split_once(" of unit ")
            .expect("named by its unit");
        let unit: usize = unit.parse().unwrap();
        assert_eq!(flight.bytes, Some(bytes(unit)), "{}", flight.name);
        assert!(flight.start <= flight.end);
        match what {
            "reduce-scatter" => reduced.push(unit),
            "all-gather" => {
                gathers += 1;
                // The first operation reading the unit after the launch starts after landing.
                let reader = compute
                    .iter()
                    .zip(&ops)
                    .find(|(s, op)| s.start >= flight.start && op.reads.contains(&unit))
                    .expect("a prefetched unit is read");
                assert!(flight.end <= reader.0.start, "{} landed late", flight.name);
            }
            other => panic!("unexpected collective {other}"),
        }
    }
    reduced.sort_unstable();
    assert_eq!(reduced, (0..units.len()).collect::<Vec<_>>());
    assert!(gathers > 0, "stage 3 prefetches");
    let overlaps =
        of(Lane::Collective).any(|f| compute.iter().any(|c| f.start < c.start && c.end < f.end));
    assert!(
        overlaps,
        "some collective is in flight across a whole operation"
    );
}

/// With the optimizer offloaded: the step's span holds one update span per unit, in unit
/// order, each followed by its parameters' all-gather, and the host arena's bytes are
/// sampled beside the arena's.
#[test]
fn an_offloaded_step_holds_each_unit_s_update_and_samples_the_host_arena() {
    let comm = zero_comm::local::create(1).unwrap().remove(0);
    let train = SHAPE.train_program(None);
    let config = EngineConfig {
        stage: ZeroStage::Zero2,
        offload_optimizer: true,
        ..EngineConfig::default()
    };
    let trace = trace_one_step(comm, &train, None, config);
    let optimizer: Vec<_> = trace
        .spans
        .iter()
        .filter(|s| s.lane == Lane::Optimizer)
        .collect();
    let step = optimizer.last().expect("the step's span");
    assert_eq!(step.name, "step 1");
    let updates: Vec<&str> = optimizer[..optimizer.len() - 1]
        .iter()
        .map(|s| s.name.as_str())
        .collect();
    // Stage 2 keeps parameters whole and updates them by shard: each update is followed by
    // its unit's all-gather.
    let want: Vec<String> = (0..SHAPE.units().len())
        .flat_map(|u| [format!("update unit {u}"), format!("all-gather unit {u}")])
        .collect();
    assert_eq!(updates, want);
    assert!(optimizer
        .iter()
        .all(|s| step.start <= s.start && s.end <= step.end));
    let host = |name: &str| trace.samples.iter().filter(|s| s.name == name).count();
    assert!(host("host arena bytes") > 0);
    assert_eq!(host("host arena bytes"), host("arena bytes"));
    assert!(trace
        .samples
        .iter()
        .filter(|s| s.name == "host arena bytes")
        .all(|s| s.value > 0));
}

/// With the delayed update, the update of step 1 runs on its thread during step 2 and its
/// spans join the timeline when it lands (at step 2's optimizer step): one per unit, each
/// after step 1's span began, none left out while the engine traces.
#[test]
fn a_delayed_update_s_spans_join_the_timeline_when_it_lands() {
    let comm = zero_comm::local::create(1).unwrap().remove(0);
    let train = SHAPE.train_program(None);
    let config = EngineConfig {
        stage: ZeroStage::Zero2,
        offload_optimizer: true,
        delayed_param_update: true,
        ..EngineConfig::default()
    };
    let mut e = Engine::new(comm, SHAPE.units(), &[train.schedule()], config, |u, w| {
        init(&SHAPE, u, w)
    })
    .unwrap();
    let mut mlp = Mlp::new(SHAPE, None, vec![], vec![]);
    e.start_trace();
    for step in 0..2 {
        let (x, y) = micro_batch(&SHAPE, step, 0, 0);
        mlp.set_batch(x, y);
        e.micro_step(&train, &mut mlp).unwrap();
        e.step(1e-3).unwrap();
    }
    let trace = e.take_trace().unwrap();
    let first = trace.spans.iter().find(|s| s.name == "step 1").unwrap();
    let delayed: Vec<_> = trace
        .spans
        .iter()
        .filter(|s| s.name.starts_with("delayed update unit"))
        .collect();
    let want: Vec<String> = (0..SHAPE.units().len())
        .map(|u| format!("delayed update unit {u}"))
        .collect();
    let names: Vec<String> = delayed.iter().map(|s| s.name.clone()).collect();
    assert_eq!(names, want, "step 1's update, landed at step 2");
    assert!(delayed.iter().all(|s| s.lane == Lane::Optimizer));
    assert!(delayed.iter().all(|s| first.start <= s.start));
}
