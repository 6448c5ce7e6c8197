//! The engine runs the calls its model declared, overlapping units included, and refuses a
//! call the declaration does not make: the memory plan is a replay of that declaration.

use zero::{Engine, EngineConfig, Error, Schedule, UnitCall, UnitSpec, ZeroStage};
use UnitCall::{BeginBackward as Begin, EndBackward as End, Gather, Release};

fn engine(calls: Vec<UnitCall>) -> Engine {
    let comm = zero_comm::local::create(1).unwrap().remove(0);
    let config = EngineConfig {
        stage: ZeroStage::Zero3,
        ..EngineConfig::default()
    };
    let units = vec![
        UnitSpec::new("tied", 300),
        UnitSpec::new("b", 300),
        UnitSpec::new("c", 300),
    ];
    let schedule = Schedule::new(calls);
    Engine::with_schedule(comm, units, &schedule, config, |_, w| w.fill(1.0)).unwrap()
}

/// Unit 0 stays gathered with its gradient open across units 1 and 2.
fn overlapping() -> Vec<UnitCall> {
    vec![
        Gather(0),
        Begin(0),
        Gather(1),
        Begin(1),
        End(1),
        Release(1),
        Gather(2),
        Begin(2),
        End(2),
        Release(2),
        End(0),
        Release(0),
    ]
}

fn run(e: &mut Engine, calls: &[UnitCall]) -> Result<(), Error> {
    make(e, calls)?;
    e.end_micro_step()
}

fn make(e: &mut Engine, calls: &[UnitCall]) -> Result<(), Error> {
    for &call in calls {
        match call {
            Gather(u) => e.gather(u)?,
            Release(u) => e.release(u)?,
            Begin(u) => e.begin_backward(u)?,
            End(u) => e.end_backward(u)?,
        }
    }
    Ok(())
}

#[test]
fn overlapping_units_run_as_declared_and_peak_at_the_plan() {
    let mut e = engine(overlapping());
    for _ in 0..2 {
        run(&mut e, &overlapping()).unwrap();
        e.step(1e-3).unwrap();
    }
    let peak = e.arena().stats().peak_allocated as u64;
    assert_eq!(peak, e.memory_plan().total());
    // Three whole f32 units live at once at least (unit 0's copy and gradient, unit 1's copy).
    assert!(e.memory_plan().transient >= 3 * 384 * 4);
}

#[test]
fn a_call_off_the_schedule_is_refused_with_both_calls_named() {
    let mut e = engine(overlapping());
    e.gather(0).unwrap();
    let err = e.gather(1).unwrap_err();
    match &err {
        Error::OffSchedule {
            position: 1,
            got,
            declared,
            ..
        } => {
            assert_eq!(got, "gather(1)");
            assert_eq!(declared, "begin_backward(0)");
        }
        other => panic!("expected OffSchedule, got {other:?}"),
    }
}

#[test]
fn a_micro_step_that_stops_short_is_refused() {
    let mut e = engine(overlapping());
    make(&mut e, &overlapping()[..4]).unwrap();
    assert!(matches!(
        e.end_micro_step(),
        Err(Error::OffSchedule { position: 4, .. })
    ));
}

#[test]
fn the_model_may_borrow_only_what_it_declared() {
    let comm = zero_comm::local::create(1).unwrap().remove(0);
    let config = EngineConfig {
        activation_bytes: 1024,
        ..EngineConfig::default()
    };
    let units = vec![UnitSpec::new("a", 100)];
    let mut e = Engine::new(comm, units, config, |_, w| w.fill(1.0)).unwrap();
    // 200 floats round up to 1024 bytes: exactly what was declared.
    let _kept = e.lend_f32(200).unwrap();
    assert!(matches!(
        e.lend_f32(1),
        Err(Error::Undeclared {
            lent: 1280,
            declared: 1024
        })
    ));
}
