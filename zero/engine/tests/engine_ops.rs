//! The engine's passes over model states run through its `Kernels` and its `Collectives`:
//! kernels written here from the trait's contract alone (naive loops, AdamW from its formula)
//! train to the same bits as the built-in host kernels at every stage and precision, and see
//! the calls the engine's data flow implies; the device-local collectives (zero-comm's
//! protocol for ranks sharing one GPU, here on host memory) train to the same bits as the
//! host communicator.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use half::{bf16, f16};
use zero::collectives::DeviceLocalCollectives;
use zero::kernels::{AdamWBuffers, AdamWStep, Span};
use zero::{
    Collectives, Engine, EngineConfig, EngineOps, Error, HostCollectives, Kernels, OpUnits,
    Precision, UnitSpec, ZeroStage,
};
use zero_alloc::Arena;
use zero_comm::DType;

/// Calls per kernel: fill_zero, copy, widen, narrow, accumulate, add_squares, adamw.
#[derive(Debug, Default)]
struct Counts([AtomicUsize; 7]);

impl Counts {
    fn get(&self, k: usize) -> usize {
        self.0[k].load(Ordering::Relaxed)
    }
}

const ADAMW: usize = 6;
const ADD_SQUARES: usize = 5;
const ACCUMULATE: usize = 4;
const WIDEN: usize = 2;

/// Counts its calls; its own overflow note.
#[derive(Debug)]
struct Naive(Arc<Counts>, AtomicBool);

/// A storage element, converted by the `half` crate (not by the engine's code).
trait El: bytemuck::Pod {
    fn get(self) -> f32;
    fn put(x: f32) -> Self;
}

impl El for f32 {
    fn get(self) -> f32 {
        self
    }
    fn put(x: f32) -> Self {
        x
    }
}

impl El for bf16 {
    fn get(self) -> f32 {
        self.to_f32()
    }
    fn put(x: f32) -> Self {
        bf16::from_f32(x)
    }
}

impl El for f16 {
    fn get(self) -> f32 {
        self.to_f32()
    }
    fn put(x: f32) -> Self {
        f16::from_f32(x)
    }
}

/// Reads `span` as f32 values.
fn read<S: El>(arena: &Arena, span: Span) -> Vec<f32> {
    arena.slice::<S>(span.block).unwrap()[span.range()]
        .iter()
        .map(|x| x.get())
        .collect()
}

/// Writes f32 `values`, rounded to `S`, into `span`.
fn write<S: El>(arena: &mut Arena, span: Span, values: &[f32]) {
    assert_eq!(values.len(), span.len);
    let out = &mut arena.slice_mut::<S>(span.block).unwrap()[span.range()];
    for (o, &x) in out.iter_mut().zip(values) {
        *o = S::put(x);
    }
}

fn read_as(arena: &Arena, dtype: DType, span: Span) -> Vec<f32> {
    match dtype {
        DType::F32 => read::<f32>(arena, span),
        DType::Bf16 => read::<bf16>(arena, span),
        DType::F16 => read::<f16>(arena, span),
        other => panic!("the engine stores no {other}"),
    }
}

fn write_as(arena: &mut Arena, dtype: DType, span: Span, values: &[f32]) {
    match dtype {
        DType::F32 => write::<f32>(arena, span, values),
        DType::Bf16 => write::<bf16>(arena, span, values),
        DType::F16 => write::<f16>(arena, span, values),
        other => panic!("the engine stores no {other}"),
    }
}

impl Naive {
    fn count(&self, k: usize) {
        self.0 .0[k].fetch_add(1, Ordering::Relaxed);
    }
}

impl Kernels for Naive {
    fn name(&self) -> &'static str {
        "naive"
    }

    fn fill_zero(&self, arena: &mut Arena, dtype: DType, dst: Span) -> Result<(), Error> {
        self.count(0);
        write_as(arena, dtype, dst, &vec![0.0; dst.len]);
        Ok(())
    }

    fn copy(&self, arena: &mut Arena, dtype: DType, src: Span, dst: Span) -> Result<(), Error> {
        self.count(1);
        let values = read_as(arena, dtype, src);
        write_as(arena, dtype, dst, &values);
        Ok(())
    }

    fn widen(
        &self,
        arena: &mut Arena,
        dtype: DType,
        src: Span,
        dst: Span,
        f: f32,
    ) -> Result<(), Error> {
        self.count(WIDEN);
        let values: Vec<f32> = read_as(arena, dtype, src)
            .iter()
            .map(|x| if f == 1.0 { *x } else { x * f })
            .collect();
        write_as(arena, DType::F32, dst, &values);
        Ok(())
    }

    fn narrow(
        &self,
        arena: &mut Arena,
        dtype: DType,
        src: Span,
        dst: Span,
        f: f32,
    ) -> Result<(), Error> {
        self.count(3);
        let values: Vec<f32> = read_as(arena, DType::F32, src)
            .iter()
            .map(|x| if f == 1.0 { *x } else { x * f })
            .collect();
        write_as(arena, dtype, dst, &values);
        Ok(())
    }

    fn accumulate(&self, arena: &mut Arena, dtype: DType, acc: Span, x: Span) -> Result<(), Error> {
        self.count(ACCUMULATE);
        let add = read_as(arena, dtype, x);
        let sum: Vec<f32> = read_as(arena, dtype, acc)
            .iter()
            .zip(&add)
            .map(|(a, b)| a + b)
            .collect();
        write_as(arena, dtype, acc, &sum);
        if read_as(arena, dtype, acc).iter().any(|x| !x.is_finite()) {
            self.1.store(true, Ordering::Relaxed);
        }
        Ok(())
    }

    fn take_overflow(&self, _arena: &mut Arena) -> Result<bool, Error> {
        Ok(self.1.swap(false, Ordering::Relaxed))
    }

    fn add_squares(
        &self,
        arena: &mut Arena,
        dtype: DType,
        src: Span,
        f: f32,
        sum: f64,
    ) -> Result<f64, Error> {
        self.count(ADD_SQUARES);
        Ok(read_as(arena, dtype, src)
            .iter()
            .fold(sum, |s, &x| s + f64::from(x * f) * f64::from(x * f)))
    }

    fn adamw(
        &self,
        arena: &mut Arena,
        dtype: DType,
        b: &AdamWBuffers,
        s: &AdamWStep<'_>,
    ) -> Result<(), Error> {
        self.count(ADAMW);
        let g: Vec<f32> = read_as(arena, dtype, b.grads)
            .iter()
            .map(|x| x * s.grad_factor * s.clip_coef)
            .collect();
        let (mut m, mut v) = (read::<f32>(arena, b.m), read::<f32>(arena, b.v));
        let weights = b.master.unwrap_or(b.params);
        let mut p = read::<f32>(arena, weights);
        naive_adamw(s, &mut p, &g, &mut m, &mut v);
        write::<f32>(arena, b.m, &m);
        write::<f32>(arena, b.v, &v);
        write::<f32>(arena, weights, &p);
        if b.master.is_some() {
            write_as(arena, dtype, b.params, &p);
        }
        Ok(())
    }
}

/// AdamW as PyTorch defines it, bias corrections in f64 rounded to f32; elements that no
/// decay segment covers (padding) are left alone.
fn naive_adamw(s: &AdamWStep<'_>, p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32]) {
    let a = s.adam;
    let t = s.t as i32;
    let step_size = (f64::from(s.lr) / (1.0 - f64::from(a.beta1).powi(t))) as f32;
    let inv_sqrt_bc2 = (1.0 / (1.0 - f64::from(a.beta2).powi(t)).sqrt()) as f32;
    for i in 0..p.len() {
        let unit_index = s.offset + i;
        let Some(seg) = s
            .segments
            .iter()
            .find(|seg| seg.range.contains(&unit_index))
        else {
            continue;
        };
        let decay = if seg.decay {
            1.0 - s.lr * a.weight_decay
        } else {
            1.0
        };
        m[i] = a.beta1 * m[i] + (1.0 - a.beta1) * g[i];
        v[i] = a.beta2 * v[i] + (1.0 - a.beta2) * g[i] * g[i];
        p[i] = p[i] * decay - step_size * (m[i] / (v[i].sqrt() * inv_sqrt_bc2 + a.eps));
    }
}

const STEPS: usize = 4;
const UNITS: [usize; 3] = [300, 1000, 77];

/// Which implementations a run uses.
#[derive(Clone)]
struct Variant {
    /// Count calls in the naive kernels (host kernels when `None`).
    naive: Option<Arc<Counts>>,
    /// zero-comm's device-local protocol on host memory instead of the host communicator.
    device_local: bool,
}

/// Trains a toy model (loss = Σ w², gradient 2w times a rank-dependent scale) for `STEPS`
/// steps; returns rank 0's final whole parameters of every unit and the grad norms.
fn train(world: usize, config: EngineConfig, variant: &Variant) -> (Vec<Vec<f32>>, Vec<f32>) {
    let comms = zero_comm::local::create(world).unwrap();
    let mut device_local = zero_comm::device_local::create(world, zero_comm::Config::default())
        .unwrap()
        .into_iter();
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|comm| {
                let kernels: Box<dyn Kernels> = match &variant.naive {
                    Some(counts) => Box::new(Naive(Arc::clone(counts), AtomicBool::new(false))),
                    None => Box::new(zero::HostKernels::default()),
                };
                let peer = device_local.next().unwrap();
                let device_local = variant.device_local;
                // Collectives are not `Send` (NCCL's are bound to a thread): built in the rank's.
                s.spawn(move || {
                    let collectives: Box<dyn Collectives> = if device_local {
                        Box::new(DeviceLocalCollectives::host(peer))
                    } else {
                        Box::new(HostCollectives)
                    };
                    let ops = EngineOps {
                        device: zero_alloc::Device::Cpu,
                        kernels,
                        collectives,
                        nvme_path: None,
                    };
                    rank_main(comm, config, ops)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    results.into_iter().next().unwrap()
}

fn rank_main(
    comm: zero_comm::Communicator,
    config: EngineConfig,
    ops: EngineOps,
) -> (Vec<Vec<f32>>, Vec<f32>) {
    let specs: Vec<UnitSpec> = UNITS
        .iter()
        .enumerate()
        .map(|(u, &n)| UnitSpec::new(format!("u{u}"), n).with_decay(0..n / 2))
        .collect();
    let program = common::sequential(specs.len());
    let init = |u: usize, w: &mut [f32]| {
        for (i, x) in w.iter_mut().enumerate() {
            *x = ((i * 7 + u * 3) % 17) as f32 / 17.0 - 0.4;
        }
    };
    let schedules = [program.schedule()];
    let mut e = Engine::with_ops(comm, specs, &schedules, config, ops, init).unwrap();
    // Small enough for fp16 at its first loss scale, so no step is skipped.
    let scale = (e.rank() + 1) as f32 * 1e-3;
    // Backward: the gradient of Σ w², times a rank-dependent scale.
    let mut model =
        common::FnModel::new(|&(backward, _): &(bool, usize), units: &mut OpUnits<'_>| {
            if backward {
                let (p, mut g) = units.views()?;
                for (gi, &w) in g[0].iter_mut().zip(p[0]) {
                    *gi = 2.0 * w * scale;
                }
            }
            Ok(())
        });
    let mut norms = vec![];
    for _ in 0..STEPS {
        e.micro_step(&program, &mut model).unwrap();
        norms.push(e.step(1e-2).unwrap().grad_norm);
    }
    let params = (0..UNITS.len())
        .map(|u| e.with_whole_params(u, <[f32]>::to_vec).unwrap())
        .collect();
    (params, norms)
}

/// Asserts two runs ended with the same bits.
fn assert_same(a: &(Vec<Vec<f32>>, Vec<f32>), b: &(Vec<Vec<f32>>, Vec<f32>), what: &str) {
    assert_eq!(a.1, b.1, "grad norms, {what}");
    for (u, (x, y)) in a.0.iter().zip(&b.0).enumerate() {
        let same = x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits());
        assert!(same, "unit {u} parameters differ, {what}");
    }
}

const HOST: Variant = Variant {
    naive: None,
    device_local: false,
};

fn config(stage: ZeroStage, precision: Precision) -> EngineConfig {
    EngineConfig {
        stage,
        precision,
        reduce_bucket_bytes: 512,
        // Below the toy's norms, so the norm reaches every parameter through clipping.
        grad_clip: 1e-4,
        ..EngineConfig::default()
    }
}

#[test]
fn kernels_from_the_contract_train_to_the_same_bits() {
    for precision in [Precision::Fp32, Precision::Bf16, Precision::Fp16] {
        for stage in ZeroStage::ALL {
            for world in [1, 2, 3] {
                let config = config(stage, precision);
                let counts = Arc::new(Counts::default());
                let naive = Variant {
                    naive: Some(Arc::clone(&counts)),
                    device_local: false,
                };
                let host = train(world, config, &HOST);
                let ran = train(world, config, &naive);
                let what = format!("{precision:?} {stage:?} world {world}");
                assert_same(&host, &ran, &what);
                // One AdamW call per unit per applied step on every rank (fp16 skips the
                // steps that overflow, with an infinite norm).
                let applied = ran.1.iter().filter(|n| n.is_finite()).count();
                assert!(applied > 0, "{what}");
                assert_eq!(counts.get(ADAMW), world * UNITS.len() * applied, "{what}");
                assert!(
                    counts.get(ACCUMULATE) >= world * UNITS.len() * applied,
                    "{what}"
                );
                assert!(
                    counts.get(ADD_SQUARES) >= world * UNITS.len() * applied,
                    "{what}"
                );
                // f32 storage is read in place or gathered straight into the compute copy.
                let widens = precision != Precision::Fp32;
                assert_eq!(counts.get(WIDEN) > 0, widens, "{what}");
            }
        }
    }
}

#[test]
fn device_local_collectives_train_to_the_same_bits() {
    let device_local = Variant {
        naive: None,
        device_local: true,
    };
    for precision in [Precision::Fp32, Precision::Bf16] {
        for stage in ZeroStage::ALL {
            for world in [1, 2, 4] {
                let config = config(stage, precision);
                let what = format!("{precision:?} {stage:?} world {world}");
                let host = train(world, config, &HOST);
                assert_same(&host, &train(world, config, &device_local), &what);
            }
        }
    }
}

/// The overflow note follows the stored sums: two finite fp16 halves whose sum passes 65504
/// (accumulated micro-steps) are noted, though neither input is inf; the same values in bf16
/// and f32, whose range holds the sum, are not; an inf input is noted in every type.
#[test]
fn the_overflow_note_follows_the_stored_sum() {
    let cases = [
        (DType::F16, [40000.0, 1.0], true),
        (DType::Bf16, [40000.0, 1.0], false),
        (DType::F32, [40000.0, 1.0], false),
        (DType::F16, [1.0, 2.0], false),
        (DType::Bf16, [f32::INFINITY, 1.0], true),
        (DType::F32, [1.0, f32::NAN], true),
    ];
    for (dtype, values, noted) in cases {
        let kernels = zero::HostKernels::default();
        let mut arena = Arena::host(1 << 12).unwrap();
        let acc = arena.alloc_elems::<f32>(2).unwrap();
        let x = arena.alloc_elems::<f32>(2).unwrap();
        let (acc, x) = (Span::new(acc, 0..2), Span::new(x, 0..2));
        write_as(&mut arena, dtype, acc, &[40000.0, 1.0]);
        write_as(&mut arena, dtype, x, &values);
        kernels.accumulate(&mut arena, dtype, acc, x).unwrap();
        let what = format!("{dtype:?} 40000 + {values:?}");
        assert_eq!(kernels.take_overflow(&mut arena).unwrap(), noted, "{what}");
        // Taken: the note is cleared.
        assert!(!kernels.take_overflow(&mut arena).unwrap(), "{what}");
    }
}
