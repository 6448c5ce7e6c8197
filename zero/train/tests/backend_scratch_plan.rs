//! A backend's kernel scratch lives in the rank's arena: the plan grows by exactly the
//! scratch the backend declares (rounded up to the arena's alignment), the arena lends
//! exactly the plan, the backend is handed that block, the measured peak of two training
//! steps is the plan to the byte, and a plan that leaves the scratch out is refused.
//!
//! The backend is the CPU kernels behind another type that declares a scratch (the CPU
//! backend itself needs none), so this runs without a GPU.

// The llm.c signature (outputs, inputs, then every dimension) is the trait's.
#![allow(clippy::too_many_arguments)]

use std::borrow::Cow;
use std::sync::Mutex;

use zero::{Engine, EngineConfig, OpUnits, ZeroStage};
use zero_gpt::{init_unit, Backend, Buffer, CpuBackend, Gpt, GptConfig, GptError, Rng};
use zero_train::bridge::{
    activation_arena_bytes, arena_activations, gpt_engine, kept_inputs, micro_step,
    ActivationPlacement, Placement, StepError, Views,
};

const B: usize = 2;
const T: usize = 16;
/// Scratch the backend declares: 37 floats, 148 bytes, one 256-byte aligned block.
const SCRATCH: usize = 37;
const SCRATCH_IN_ARENA: u64 = 256;

/// The CPU kernels, declaring [`SCRATCH`] floats of scratch and keeping what it is given.
#[derive(Debug, Default)]
struct WithScratch {
    provided: Mutex<Option<Buffer>>,
}

macro_rules! cpu {
    ($($name:ident($($arg:ident: $ty:ty),*);)*) => {
        $(fn $name(&self, $($arg: $ty),*) {
            CpuBackend.$name($($arg),*)
        })*
    };
}

impl Backend for WithScratch {
    type Slice = [f32];
    type Ids = [u32];

    fn alloc(&self, len: usize) -> zero_gpt::Result<Buffer> {
        CpuBackend.alloc(len)
    }
    fn ids(view: &[f32]) -> &[u32] {
        CpuBackend::ids(view)
    }
    fn ids_mut(view: &mut [f32]) -> &mut [u32] {
        CpuBackend::ids_mut(view)
    }
    fn mean(&self, x: &[f32]) -> zero_gpt::Result<f32> {
        CpuBackend.mean(x)
    }
    fn scratch_len(&self, _: &GptConfig, _: usize, _: usize) -> zero_gpt::Result<usize> {
        Ok(SCRATCH)
    }
    fn provide_scratch(&self, scratch: Buffer) {
        *self.provided.lock().unwrap() = Some(scratch);
    }
    cpu! {
        upload_ids(dst: &mut [u32], src: &[u32]);
        fill(out: &mut [f32], value: f32);
        copy(dst: &mut [f32], src: &[f32]);
        encoder_forward(out: &mut [f32], tokens: &[u32], wte: &[f32], wpe: &[f32], b: usize, t: usize, c: usize);
        encoder_backward(dwte: &mut [f32], dwpe: &mut [f32], dout: &[f32], tokens: &[u32], b: usize, t: usize, c: usize);
        layernorm_forward(out: &mut [f32], mean: &mut [f32], rstd: &mut [f32], inp: &[f32], weight: &[f32], bias: &[f32], n: usize, c: usize);
        layernorm_backward(dinp: &mut [f32], dweight: &mut [f32], dbias: &mut [f32], dout: &[f32], inp: &[f32], weight: &[f32], mean: &[f32], rstd: &[f32], n: usize, c: usize);
        matmul_forward(out: &mut [f32], inp: &[f32], weight: &[f32], bias: Option<&[f32]>, n: usize, c: usize, oc: usize);
        matmul_backward(dinp: &mut [f32], dweight: &mut [f32], dbias: Option<&mut [f32]>, dout: &[f32], inp: &[f32], weight: &[f32], n: usize, c: usize, oc: usize);
        matmul_backward_input(dinp: &mut [f32], dout: &[f32], weight: &[f32], n: usize, c: usize, oc: usize);
        matmul_backward_weight(dweight: &mut [f32], dbias: Option<&mut [f32]>, dout: &[f32], inp: &[f32], n: usize, c: usize, oc: usize);
        attention_forward(out: &mut [f32], att: &mut [f32], qkv: &[f32], b: usize, t: usize, c: usize, nh: usize);
        attention_backward(dqkv: &mut [f32], dout: &[f32], qkv: &[f32], att: &[f32], b: usize, t: usize, c: usize, nh: usize);
        gelu_forward(out: &mut [f32], inp: &[f32]);
        gelu_backward(dinp: &mut [f32], inp: &[f32], dout: &[f32]);
        residual_forward(out: &mut [f32], inp1: &[f32], inp2: &[f32]);
        residual_backward(dinp1: &mut [f32], dinp2: &mut [f32], dout: &[f32]);
        crossentropy_forward(losses: &mut [f32], logits: &mut [f32], targets: &[u32], n: usize, v: usize, vp: usize);
        crossentropy_backward(probs: &mut [f32], dlosses: &[f32], targets: &[u32], n: usize, v: usize, vp: usize);
    }
}

/// The CPU backend's placement: host slices of the arena.
impl Placement for WithScratch {
    fn params<'u>(units: &'u OpUnits<'_>, unit: usize) -> Result<&'u [f32], zero::Error> {
        CpuBackend::params(units, unit)
    }
    fn views<'u>(units: &'u mut OpUnits<'_>) -> Result<Views<'u, [f32]>, zero::Error> {
        CpuBackend::views(units)
    }
    fn lend(engine: &mut Engine, len: usize) -> Result<Buffer, zero::Error> {
        CpuBackend::lend(engine, len)
    }
    fn to_host<'v>(&self, view: &'v [f32]) -> Result<Cow<'v, [f32]>, GptError> {
        CpuBackend.to_host(view)
    }
    fn finish_step(&self) -> Result<(), GptError> {
        CpuBackend.finish_step()
    }
    fn memory_budget(&self) -> Option<(&'static str, u64)> {
        CpuBackend.memory_budget()
    }
    fn kept_mut<'u>(units: &'u mut OpUnits<'_>) -> Result<&'u mut [f32], zero::Error> {
        CpuBackend::kept_mut(units)
    }
    fn restored<'u>(units: &'u OpUnits<'_>) -> Result<&'u [f32], zero::Error> {
        CpuBackend::restored(units)
    }
}

/// L=3, NH=2, C=64, V=500 (padded to 512): zeror_memory_plan's model.
fn config() -> GptConfig {
    GptConfig::new(T, 500, 3, 2, 64).unwrap()
}

fn placement(every: Option<usize>) -> ActivationPlacement {
    ActivationPlacement {
        checkpoint_every: every,
        ..ActivationPlacement::default()
    }
}

/// What one rank planned, lent and measured.
struct Measured {
    plan: u64,
    peak: u64,
    lent: u64,
    provided: usize,
}

/// Two training steps at stage 3 with `declared` as the plan's activation placement.
fn run(declared: ActivationPlacement) -> Result<Measured, StepError> {
    let cfg = config();
    let model = Gpt::with_backend(cfg, WithScratch::default())?;
    let layout = model.layout().clone();
    let engine_config = EngineConfig {
        stage: ZeroStage::Zero3,
        memory_limit: Some(1 << 30), // as zeror_memory_plan: a cap far above the plan
        activation_bytes: activation_arena_bytes(&cfg, B, T, declared)?,
        kept_inputs: kept_inputs(&cfg, B, T, declared)?,
        ..EngineConfig::default()
    };
    let comm = zero_comm::local::create(1).unwrap().remove(0);
    let init = |unit: usize, w: &mut [f32]| init_unit(&cfg, &layout, unit, 3, w).unwrap();
    let mut engine = gpt_engine(
        comm,
        &layout,
        declared.checkpoint_every,
        engine_config,
        init,
    )?;
    let before = engine.arena().stats().allocated as u64;
    let mut acts = arena_activations(&mut engine, &model, B, T, declared)?;
    let lent = engine.arena().stats().allocated as u64 - before;
    let provided = model
        .backend()
        .provided
        .lock()
        .unwrap()
        .as_ref()
        .map_or(0, |s| s.floats().len());
    let mut rng = Rng::new(4);
    for _ in 0..2 {
        let seq: Vec<u32> = (0..=B * T).map(|_| (rng.next_u64() % 500) as u32).collect();
        micro_step(&mut engine, &model, &mut acts, &seq[..B * T], &seq[1..])?;
        engine.step(1e-3)?;
    }
    Ok(Measured {
        plan: engine.memory_plan().total(),
        peak: engine.arena().stats().peak_allocated as u64,
        lent,
        provided,
    })
}

#[test]
fn the_plan_grows_by_the_aligned_scratch_and_the_peak_is_the_plan() {
    let cfg = config();
    for every in [None, Some(1)] {
        let without = activation_arena_bytes(&cfg, B, T, placement(every)).unwrap();
        let declared = placement(every)
            .with_scratch_of(&WithScratch::default(), &cfg, B, T)
            .unwrap();
        assert_eq!(declared.backend_scratch, SCRATCH);
        let with = activation_arena_bytes(&cfg, B, T, declared).unwrap();
        assert_eq!(with - without, SCRATCH_IN_ARENA, "every {every:?}");
        let m = run(declared).unwrap();
        assert_eq!(m.lent, with, "the arena lends the plan, every {every:?}");
        assert_eq!(
            m.provided, SCRATCH,
            "the backend got its scratch, every {every:?}"
        );
        assert_eq!(m.peak, m.plan, "every {every:?}");
    }
}

#[test]
fn a_plan_without_the_scratch_is_refused_when_it_is_lent() {
    let err = run(placement(None))
        .err()
        .expect("the scratch is not in the plan");
    assert!(
        matches!(err, StepError::Engine(zero::Error::Undeclared { .. })),
        "{err}"
    );
}
