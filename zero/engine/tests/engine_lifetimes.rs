//! The engine runs the programs its model declared, overlapping units included, at the
//! plan's peak; it refuses a program it was not declared and an operation reaching for a unit
//! it did not declare, and a failed program leaves nothing held.

mod common;

use common::FnModel;
use zero::{Call, Engine, EngineConfig, Error, Op, OpUnits, Program, UnitSpec, ZeroStage};
use Call::{BeginBackward as Begin, EndBackward as End, Gather, Release};

fn engine(programs: &[&Program<&'static str>]) -> Engine {
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
    let schedules: Vec<_> = programs.iter().map(|p| p.schedule()).collect();
    Engine::new(comm, units, &schedules, config, |_, w| w.fill(1.0)).unwrap()
}

/// Unit 0 read and written by both operations: it stays gathered, its gradient open.
fn overlapping() -> Program<&'static str> {
    let ops = vec![
        Op::new("x").reads([0, 1]).writes([0, 1]),
        Op::new("y").reads([0, 2]).writes([0, 2]),
    ];
    Program::new(ops, 3).unwrap()
}

/// Fills every gradient the operation writes with 1.
fn ones(_: &&'static str, units: &mut OpUnits<'_>) -> Result<(), Error> {
    for g in units.views()?.1 {
        g.fill(1.0);
    }
    Ok(())
}

#[test]
fn overlapping_units_derive_the_calls_written_out_here() {
    let want = [
        Gather(0),
        Gather(1),
        Begin(0),
        Begin(1),
        End(1),
        Release(1),
        Gather(2),
        Begin(2),
        End(0),
        End(2),
        Release(0),
        Release(2),
    ];
    assert_eq!(overlapping().schedule().calls(), want);
}

#[test]
fn overlapping_units_run_and_peak_at_the_plan() {
    let program = overlapping();
    let mut e = engine(&[&program]);
    for _ in 0..2 {
        e.micro_step(&program, &mut FnModel::new(ones)).unwrap();
        e.step(1e-3).unwrap();
    }
    let peak = e.arena().stats().peak_allocated as u64;
    assert_eq!(peak, e.memory_plan().total());
    // Three whole f32 units live at once at least (unit 0's copy and gradient, unit 1's copy).
    assert!(e.memory_plan().transient >= 3 * 384 * 4);
}

#[test]
fn a_program_not_declared_is_refused() {
    let declared = overlapping();
    let mut e = engine(&[&declared]);
    let other = Program::new(vec![Op::new("z").reads([2]).writes([2])], 3).unwrap();
    let err = e.micro_step(&other, &mut FnModel::new(ones)).unwrap_err();
    assert!(
        matches!(&err, Error::BadProgram(m) if m.contains("did not declare")),
        "{err}"
    );
    assert!(e.step(1e-3).is_err(), "no micro-step ran");
}

#[test]
fn an_operation_reaching_past_its_declaration_fails_and_the_engine_lets_go() {
    let program = overlapping();
    let mut e = engine(&[&program]);
    let allocated = e.arena().stats().allocated;
    let mut sneaky =
        FnModel::new(|_: &&'static str, units: &mut OpUnits<'_>| units.params(2).map(|_| ()));
    let err = e.micro_step(&program, &mut sneaky).unwrap_err();
    assert!(err.to_string().contains("unit 2"), "{err}");
    assert_eq!(e.arena().stats().allocated, allocated, "nothing held");
    // The next micro-step runs from a clean state.
    e.micro_step(&program, &mut FnModel::new(ones)).unwrap();
    e.step(1e-3).unwrap();
}

#[test]
fn a_forward_pass_must_write_no_gradient() {
    let program = overlapping();
    let mut e = engine(&[&program]);
    let err = e.forward(&program, &mut FnModel::new(ones)).unwrap_err();
    assert!(matches!(err, Error::BadProgram(_)), "{err}");
}

#[test]
fn the_model_may_borrow_only_what_it_declared() {
    let comm = zero_comm::local::create(1).unwrap().remove(0);
    let config = EngineConfig {
        activation_bytes: 1024,
        ..EngineConfig::default()
    };
    let units = vec![UnitSpec::new("a", 100)];
    let program = common::sequential(1);
    let mut e = Engine::new(comm, units, &[program.schedule()], config, |_, w| {
        w.fill(1.0)
    })
    .unwrap();
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

#[test]
fn a_micro_step_must_write_a_gradient() {
    let program = Program::new(vec![Op::new("f").reads([0])], 3).unwrap();
    let mut e = engine(&[&program]);
    let err = e.micro_step(&program, &mut FnModel::new(ones)).unwrap_err();
    assert!(matches!(err, Error::BadProgram(_)), "{err}");
    e.forward(&program, &mut FnModel::new(ones)).unwrap();
}

/// Three operations keep inputs 0-2 (filled with `1000 k + i + pass`), then three restore
/// them in reverse, checking every value; the last also writes a gradient.
fn keeping() -> Program<(bool, usize)> {
    let mut ops: Vec<_> = (0..3)
        .map(|k| Op::new((true, k)).reads([k]).keeps(k))
        .collect();
    ops.extend((0..3).rev().map(|k| Op::new((false, k)).restores(k)));
    ops.push(Op::new((false, 9)).reads([0]).writes([0]));
    Program::new(ops, 3).unwrap()
}

fn kept_value(k: usize, i: usize, pass: usize) -> f32 {
    (1000 * k + i + pass) as f32
}

#[test]
fn kept_inputs_come_back_as_kept_in_the_arena_and_offloaded_and_after_a_failed_pass() {
    for offload in [false, true] {
        let comm = zero_comm::local::create(1).unwrap().remove(0);
        let config = EngineConfig {
            stage: ZeroStage::Zero3,
            kept_inputs: zero::KeptInputs {
                len: 70,
                offload,
                partitions: 1,
            },
            ..EngineConfig::default()
        };
        let units = vec![
            UnitSpec::new("a", 300),
            UnitSpec::new("b", 300),
            UnitSpec::new("c", 300),
        ];
        let program = keeping();
        let mut e = Engine::new(comm, units, &[program.schedule()], config, |_, w| {
            w.fill(1.0)
        })
        .unwrap();
        for pass in 0..3 {
            // Pass 1 fails while restoring input 1: input 0 is still on its way back (or
            // kept); the engine lets go, and pass 2 starts clean.
            let mut model = FnModel::new(|&(keep, k): &(bool, usize), units: &mut OpUnits<'_>| {
                if keep {
                    for (i, v) in units.kept_mut()?.iter_mut().enumerate() {
                        *v = kept_value(k, i, pass);
                    }
                } else if k < 3 {
                    if pass == 1 && k == 1 {
                        return Err(Error::Order("injected".into()));
                    }
                    let back = units.restored()?;
                    assert!(back
                        .iter()
                        .enumerate()
                        .all(|(i, &v)| v == kept_value(k, i, pass)));
                    assert!(units.kept_mut().is_err(), "it keeps nothing");
                } else {
                    ones(&"", units)?;
                }
                Ok(())
            });
            let result = e.micro_step(&program, &mut model);
            assert_eq!(result.is_err(), pass == 1, "offload {offload}, pass {pass}");
        }
        let (arena, host) = e.kept_input_bytes().unwrap();
        // 70 f32 = 280 bytes, a 512-byte block at the arena's 256-byte alignment.
        let want: (u64, u64) = if offload {
            (2 * 512, 3 * 280)
        } else {
            (3 * 512, 0)
        };
        assert_eq!((arena, host), want, "offload {offload}");
    }
}
