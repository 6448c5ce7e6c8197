//! `CudaKernels` against `HostKernels`: every kernel, every storage type, random inputs in a
//! CUDA arena and the same call on a host arena, compared under each kernel's contract
//! (bitwise, the overflow flag exact, add_squares to 1e-12 relative). Without a driver the
//! GPU tests print why they skipped (they fail instead under `ZERO_GPT_REQUIRE_GPU=1`), and
//! `CudaKernels::new` must return an error, not panic.

#![cfg(feature = "cuda")]

use half::{bf16, f16};
use zero::kernels::{AdamWBuffers, AdamWStep, CudaKernels, Span};
use zero::optim::{AdamW, DecaySegment};
use zero::{Error, HostKernels, Kernels};
use zero_alloc::{Arena, ArenaConfig, Device, Handle};
use zero_comm::DType;

const DTYPES: [DType; 3] = [DType::F32, DType::Bf16, DType::F16];
/// Elements per span: several blocks of 256 threads, not a multiple of 256.
const N: usize = 1500;
/// Spans start here in their blocks, so address offsets are exercised.
const AT: usize = 3;

fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the driver's file names; calls no symbol.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

fn gpu(test: &str) -> Option<CudaKernels> {
    if !driver_present() {
        // scripts/gpu-check.sh sets this: there, a machine without a driver fails.
        assert!(
            std::env::var("ZERO_GPT_REQUIRE_GPU").as_deref() != Ok("1"),
            "ZERO_GPT_REQUIRE_GPU=1 but no NVIDIA driver (libcuda) was found"
        );
        println!("{test}: skipped: no NVIDIA driver (libcuda) on this machine");
        return None;
    }
    match CudaKernels::new(0) {
        Ok(k) => Some(k),
        Err(e) => panic!("{test}: a driver is present but CudaKernels::new failed: {e}"),
    }
}

/// xorshift64*: values in [-2, 2), about one in `special` of them replaced by 2^k extremes.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let bits = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 40;
        (bits as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
    }

    fn values(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.next()).collect()
    }
}

/// `xs` stored as `dtype`, rounded by the `half` crate.
fn encode(dtype: DType, xs: &[f32]) -> Vec<u8> {
    match dtype {
        DType::F32 => bytemuck::cast_slice(xs).to_vec(),
        DType::Bf16 => xs
            .iter()
            .flat_map(|&x| bf16::from_f32(x).to_le_bytes())
            .collect(),
        DType::F16 => xs
            .iter()
            .flat_map(|&x| f16::from_f32(x).to_le_bytes())
            .collect(),
        other => panic!("the engine stores no {other}"),
    }
}

/// The same blocks in a host arena and in a CUDA arena.
struct Pair {
    host: Arena,
    dev: Arena,
    blocks: Vec<(Handle, Handle)>,
}

impl Pair {
    fn new() -> Self {
        let cap = 1 << 20;
        let dev = Arena::new(ArenaConfig::new(cap).device(Device::Cuda(0)));
        Self {
            host: Arena::host(cap).unwrap(),
            dev: dev.unwrap(),
            blocks: Vec::new(),
        }
    }

    /// A block holding `bytes` (plus AT elements of `elem` bytes before them) in both
    /// arenas; returns its index.
    fn block(&mut self, elem: usize, bytes: &[u8]) -> usize {
        let mut content = vec![0xA5u8; AT * elem];
        content.extend_from_slice(bytes);
        let h = self.host.alloc(content.len()).unwrap();
        let d = self.dev.alloc(content.len()).unwrap();
        self.host.write_bytes(h, &content).unwrap();
        self.dev.write_bytes(d, &content).unwrap();
        self.blocks.push((h, d));
        self.blocks.len() - 1
    }

    /// Runs `f` with HostKernels on the host arena and `cuda` on the device arena, with the
    /// span of `len` elements at AT of each block; returns both results.
    fn run<R>(
        &mut self,
        cuda: &CudaKernels,
        len: usize,
        f: impl Fn(&dyn Kernels, &mut Arena, &[Span]) -> zero::Result<R>,
    ) -> (R, R) {
        let spans = |pick: fn(&(Handle, Handle)) -> Handle| -> Vec<Span> {
            self.blocks
                .iter()
                .map(|b| Span::new(pick(b), AT..AT + len))
                .collect()
        };
        let (hs, ds) = (spans(|b| b.0), spans(|b| b.1));
        let on_host = f(&HostKernels::default(), &mut self.host, &hs).unwrap();
        let on_dev = f(cuda, &mut self.dev, &ds).unwrap();
        (on_host, on_dev)
    }

    /// Asserts every block holds the same bytes in both arenas.
    fn assert_same_bytes(&self, what: &str) {
        for (i, &(h, d)) in self.blocks.iter().enumerate() {
            let len = self.host.block(h).unwrap().len;
            let (mut a, mut b) = (vec![0u8; len], vec![0u8; len]);
            self.host.read_bytes(h, &mut a).unwrap();
            self.dev.read_bytes(d, &mut b).unwrap();
            let first = a.iter().zip(&b).position(|(x, y)| x != y);
            assert!(
                first.is_none(),
                "{what}: block {i} differs at byte {first:?}"
            );
        }
    }
}

#[test]
fn new_without_a_driver_is_an_error_naming_it_not_a_panic() {
    if driver_present() {
        println!("a driver is present: the no-driver error path is not reachable here");
        return;
    }
    match CudaKernels::new(0) {
        Err(Error::Device { op, message }) => {
            assert!(op.contains("libcuda"), "{op}");
            assert!(message.contains("driver"), "{message}");
        }
        other => panic!("expected Error::Device, got {other:?}"),
    }
}

#[test]
fn element_wise_kernels_match_the_host_bit_for_bit() {
    let Some(cuda) = gpu("element_wise_kernels_match_the_host_bit_for_bit") else {
        return;
    };
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for dtype in DTYPES {
        let s = dtype.size();
        let mut p = Pair::new();
        p.block(s, &encode(dtype, &rng.values(N)));
        p.block(s, &encode(dtype, &rng.values(N)));
        p.block(4, &encode(DType::F32, &rng.values(N)));
        p.run(&cuda, N, |k, a, sp| k.copy(a, dtype, sp[0], sp[1]));
        p.assert_same_bytes(&format!("copy {dtype:?}"));
        for factor in [1.0, 0.37, 3.1] {
            p.run(&cuda, N, |k, a, sp| k.widen(a, dtype, sp[0], sp[2], factor));
            p.assert_same_bytes(&format!("widen {dtype:?} x{factor}"));
            p.run(&cuda, N, |k, a, sp| {
                k.narrow(a, dtype, sp[2], sp[1], factor)
            });
            p.assert_same_bytes(&format!("narrow {dtype:?} x{factor}"));
        }
        p.run(&cuda, N - 7, |k, a, sp| k.fill_zero(a, dtype, sp[0]));
        p.assert_same_bytes(&format!("fill_zero {dtype:?}"));
    }
}

#[test]
fn accumulate_matches_the_host_and_flags_exactly_the_non_finite_sums() {
    let Some(cuda) = gpu("accumulate_matches_the_host") else {
        return;
    };
    let mut rng = Rng(0x51ed_2701_aa55_0f0f);
    for dtype in DTYPES {
        for bad in [
            None,
            Some(f32::INFINITY),
            Some(f32::NEG_INFINITY),
            Some(f32::NAN),
        ] {
            let mut p = Pair::new();
            let mut x = rng.values(N);
            if let Some(v) = bad {
                x[N / 2 + 11] = v;
            }
            p.block(dtype.size(), &encode(dtype, &rng.values(N)));
            p.block(dtype.size(), &encode(dtype, &x));
            let (host, dev) = p.run(&cuda, N, |k, a, sp| {
                k.accumulate(a, dtype, sp[0], sp[1])?;
                k.take_overflow(a)
            });
            assert_eq!(host, bad.is_some(), "{dtype:?} {bad:?}: host flag");
            assert_eq!(dev, host, "{dtype:?} {bad:?}: overflow flag");
            if !bad.is_some_and(f32::is_nan) {
                p.assert_same_bytes(&format!("accumulate {dtype:?} {bad:?}"));
            }
        }
        // Two finite values whose sum passes fp16's 65504: noted in f16 only.
        let mut p = Pair::new();
        let (mut acc, mut x) = (rng.values(N), rng.values(N));
        (acc[N / 3], x[N / 3]) = (40000.0, 40000.0);
        p.block(dtype.size(), &encode(dtype, &acc));
        p.block(dtype.size(), &encode(dtype, &x));
        let (host, dev) = p.run(&cuda, N, |k, a, sp| {
            k.accumulate(a, dtype, sp[0], sp[1])?;
            k.take_overflow(a)
        });
        assert_eq!(
            host,
            dtype == DType::F16,
            "{dtype:?} sum past fp16: host flag"
        );
        assert_eq!(dev, host, "{dtype:?} sum past fp16: overflow flag");
        p.assert_same_bytes(&format!("accumulate {dtype:?} sum past fp16"));
    }
}

#[test]
fn add_squares_matches_the_host_f64_sum_to_1e_12_relative() {
    let Some(cuda) = gpu("add_squares_matches_the_host") else {
        return;
    };
    let mut rng = Rng(0x0123_4567_89ab_cdef);
    for dtype in DTYPES {
        for len in [1, 255, 257, N] {
            let mut p = Pair::new();
            p.block(dtype.size(), &encode(dtype, &rng.values(N)));
            let (host, dev) = p.run(&cuda, len, |k, a, sp| {
                k.add_squares(a, dtype, sp[0], 0.75, 1.5)
            });
            let rel = (host - dev).abs() / host.abs();
            assert!(
                rel <= 1e-12,
                "{dtype:?} len {len}: host {host} device {dev}"
            );
        }
    }
}

#[test]
fn adamw_matches_the_host_bit_for_bit_over_decay_segments() {
    let Some(cuda) = gpu("adamw_matches_the_host") else {
        return;
    };
    let mut rng = Rng(0xfeed_face_cafe_beef);
    let segments = [
        DecaySegment {
            range: 0..40,
            decay: true,
        },
        DecaySegment {
            range: 40..300,
            decay: false,
        },
        DecaySegment {
            range: 320..N + 100,
            decay: true,
        },
    ];
    for dtype in DTYPES {
        let mut p = Pair::new();
        let s = dtype.size();
        let weights = rng.values(N);
        let [grads, params, scratch, m, v] = [0, 1, 2, 3, 4].map(|i| match i {
            0 => p.block(s, &encode(dtype, &rng.values(N))),
            1 => p.block(s, &encode(dtype, &weights)),
            2 => p.block(4, &encode(DType::F32, &rng.values(N))),
            3 => p.block(4, &encode(DType::F32, &rng.values(N))),
            _ => p.block(4, &encode(DType::F32, &rng.values(N).map_abs())),
        });
        let master = (dtype != DType::F32).then(|| p.block(4, &encode(DType::F32, &weights)));
        let step = AdamWStep {
            adam: AdamW::default(),
            t: 7,
            lr: 3e-4,
            grad_factor: 0.25,
            clip_coef: 0.8,
            offset: 25,
            segments: &segments,
        };
        p.run(&cuda, N, |k, a, sp| {
            let bufs = AdamWBuffers {
                grads: sp[grads],
                scratch: sp[scratch],
                master: master.map(|i| sp[i]),
                params: sp[params],
                m: sp[m],
                v: sp[v],
            };
            k.adamw(a, dtype, &bufs, &step)
        });
        p.assert_same_bytes(&format!("adamw {dtype:?}"));
    }
}

#[test]
fn a_host_arena_given_to_cuda_kernels_is_an_error() {
    let Some(cuda) = gpu("a_host_arena_given_to_cuda_kernels_is_an_error") else {
        return;
    };
    let mut host = Arena::host(1 << 12).unwrap();
    let h = host.alloc(64).unwrap();
    match cuda.fill_zero(&mut host, DType::F32, Span::new(h, 0..16)) {
        Err(Error::Device { message, .. }) => assert!(message.contains("cpu"), "{message}"),
        other => panic!("expected Error::Device, got {other:?}"),
    }
}

/// Second moments must be non-negative.
trait MapAbs {
    fn map_abs(self) -> Self;
}

impl MapAbs for Vec<f32> {
    fn map_abs(self) -> Self {
        self.into_iter().map(f32::abs).collect()
    }
}
