//! The memory plan counts on units being used one at a time, except those declared to span
//! the micro-step; the engine refuses a model that breaks the declaration instead of running
//! out of its arena.

use zero::{Engine, EngineConfig, Error, UnitSpec, ZeroStage};

fn engine(units: Vec<UnitSpec>) -> Engine {
    let comm = zero_comm::local::create(1).unwrap().remove(0);
    let config = EngineConfig {
        stage: ZeroStage::Zero3,
        ..EngineConfig::default()
    };
    Engine::new(comm, units, config, |_, w| w.fill(1.0)).unwrap()
}

#[test]
fn two_ordinary_units_in_use_at_once_are_refused() {
    let mut e = engine(vec![UnitSpec::new("a", 300), UnitSpec::new("b", 300)]);
    e.gather(0).unwrap();
    assert!(matches!(
        e.gather(1),
        Err(Error::OverlappingUnits { unit: 1, other: 0 })
    ));
    e.begin_backward(0).unwrap();
    assert!(matches!(
        e.begin_backward(1),
        Err(Error::OverlappingUnits { unit: 1, other: 0 })
    ));
}

#[test]
fn a_spanning_unit_may_be_in_use_beside_another() {
    let mut e = engine(vec![
        UnitSpec::new("tied", 300).spanning_micro_step(),
        UnitSpec::new("b", 300),
        UnitSpec::new("c", 300),
    ]);
    e.gather(0).unwrap();
    e.begin_backward(0).unwrap();
    e.gather(1).unwrap();
    e.begin_backward(1).unwrap();
    e.end_backward(1).unwrap();
    e.release(1).unwrap();
    // Unit 1 is done: unit 2 may follow while the spanning unit stays.
    e.gather(2).unwrap();
    e.begin_backward(2).unwrap();
    e.end_backward(2).unwrap();
    e.release(2).unwrap();
    e.end_backward(0).unwrap();
    e.release(0).unwrap();
    e.end_micro_step();
    e.step(1e-3).unwrap();
}
