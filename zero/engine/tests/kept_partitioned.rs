//! Kept inputs partitioned over a tensor-parallel group (P_a): each rank stores a padded
//! slice, and a restore reads back the whole input every rank wrote, all-gathered from the
//! slices, in the arena and offloaded, after a failed pass too; the arena holds the slices
//! and one whole-input buffer, as the plan says.

mod common;

use common::FnModel;
use zero::{Engine, EngineConfig, Error, KeptInputs, Op, OpUnits, Program, UnitSpec, ZeroStage};

/// Three operations keep inputs 0-2, then three restore them in reverse, checking every
/// value; the last also writes a gradient.
fn keeping() -> Program<(bool, usize)> {
    let mut ops: Vec<_> = (0..3)
        .map(|k| Op::new((true, k)).reads([k]).keeps(k))
        .collect();
    ops.extend((0..3).rev().map(|k| Op::new((false, k)).restores(k)));
    ops.push(Op::new((false, 9)).reads([0]).writes([0]));
    Program::new(ops, 3).unwrap()
}

/// The value at `i` of kept input `k` in pass `pass`, the same on every rank of the group
/// (a block input is replicated across it).
fn kept_value(k: usize, i: usize, pass: usize) -> f32 {
    (1000 * k + i + 7 * pass) as f32
}

/// 71 f32, odd: two slices of 36, the last padded by one.
const LEN: usize = 71;

fn config(offload: bool) -> EngineConfig {
    EngineConfig {
        stage: ZeroStage::Zero3,
        kept_inputs: KeptInputs {
            len: LEN,
            offload,
            partitions: 2,
        },
        ..EngineConfig::default()
    }
}

fn engine(program: &Program<(bool, usize)>, offload: bool) -> Engine {
    let comm = zero_comm::local::create(1).unwrap().remove(0);
    let units = (0..3).map(|u| UnitSpec::new(format!("{u}"), 300)).collect();
    Engine::new(
        comm,
        units,
        &[program.schedule()],
        config(offload),
        |_, w| w.fill(1.0),
    )
    .unwrap()
}

/// Runs three passes on one rank of the group `tp`; pass 1 fails while restoring input 1.
fn run_rank(tp: zero_comm::Communicator, offload: bool) -> (u64, u64, u64) {
    let program = keeping();
    let mut e = engine(&program, offload).with_tensor_parallel(tp);
    for pass in 0..3 {
        let mut model = FnModel::new(|&(keep, k): &(bool, usize), units: &mut OpUnits<'_>| {
            if keep {
                let kept = units.kept_mut()?;
                assert_eq!(
                    kept.len(),
                    LEN,
                    "the operation sees the input, not the padding"
                );
                for (i, v) in kept.iter_mut().enumerate() {
                    *v = kept_value(k, i, pass);
                }
            } else if k < 3 {
                if pass == 1 && k == 1 {
                    return Err(Error::Order("injected".into()));
                }
                let back = units.restored()?;
                assert_eq!(back.len(), LEN);
                for (i, &v) in back.iter().enumerate() {
                    assert_eq!(v, kept_value(k, i, pass), "input {k}[{i}], pass {pass}");
                }
            } else {
                for g in units.views()?.1 {
                    g.fill(1.0);
                }
            }
            Ok(())
        });
        let result = e.micro_step(&program, &mut model);
        assert_eq!(result.is_err(), pass == 1, "offload {offload}, pass {pass}");
    }
    let (arena, host) = e.kept_input_bytes().unwrap();
    (arena, host, e.memory_plan().kept_inputs)
}

#[test]
fn partitioned_inputs_come_back_whole_from_the_slices_of_the_group() {
    for offload in [false, true] {
        let tps = zero_comm::local::create(2).unwrap();
        let measured: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = tps
                .into_iter()
                .map(|tp| s.spawn(move || run_rank(tp, offload)))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        // A slice: 36 f32 = 144 bytes, one 256-byte block; the whole-input buffer: 72 f32 =
        // 288 bytes, two blocks. The program holds one kept input at a time.
        let want = if offload {
            (512, 3 * 144, 512)
        } else {
            (3 * 256 + 512, 0, 3 * 256 + 512)
        };
        assert_eq!(measured, vec![want; 2], "offload {offload}");
    }
}

#[test]
fn partitioned_inputs_need_the_tensor_parallel_group() {
    let program = keeping();
    let mut e = engine(&program, false);
    let mut model = FnModel::new(|&(keep, _): &(bool, usize), units: &mut OpUnits<'_>| {
        if keep {
            units.kept_mut()?.fill(1.0);
        }
        Ok(())
    });
    let err = e.micro_step(&program, &mut model).unwrap_err();
    assert!(err.to_string().contains("with_tensor_parallel"), "{err}");
}
