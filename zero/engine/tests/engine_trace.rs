//! The engine's timeline: every operation of a micro-step recorded once, in program order,
//! without overlap; each offloaded kept input copied out and back once, its fetch landed
//! before the operation that restores it starts; the optimizer step after them; and the
//! Chrome trace document holds every span and sample with times from the earliest one.

#[path = "../examples/mlp/model.rs"]
#[allow(dead_code)]
mod model;

use model::{init, micro_batch, Mlp, Shape};
use zero::{chrome_trace, Engine, EngineConfig, Lane, Trace, ZeroStage};

const SHAPE: Shape = Shape {
    inputs: 6,
    hidden: 16,
    classes: 3,
    blocks: 4,
    batch: 4,
};
const EVERY: Option<usize> = Some(1);

fn traced_step() -> (Trace, Vec<String>, Vec<(usize, usize)>) {
    let comm = zero_comm::local::create(1).unwrap().remove(0);
    let train = SHAPE.train_program(EVERY);
    let config = EngineConfig {
        stage: ZeroStage::Zero3,
        kept_inputs: SHAPE.kept_inputs(true),
        ..EngineConfig::default()
    };
    let mut e = Engine::new(comm, SHAPE.units(), &[train.schedule()], config, |u, w| {
        init(&SHAPE, u, w)
    })
    .unwrap();
    let mut mlp = Mlp::new(SHAPE, EVERY, vec![], vec![]);
    let (x, y) = micro_batch(&SHAPE, 0, 0, 0);
    mlp.set_batch(x, y);
    e.start_trace();
    e.micro_step(&train, &mut mlp).unwrap();
    e.step(1e-3).unwrap();
    let trace = e.take_trace().unwrap();
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
    assert_eq!(count("X"), 2 * trace.spans.len());
    assert_eq!(count("C"), 2 * trace.samples.len());
    // Per rank: its process name and one name per lane.
    assert_eq!(count("M"), 2 * 5);
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
