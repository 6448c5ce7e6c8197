//! The model generic over its backend: a backend of another type that wraps the CPU kernels
//! and counts every call gives `Gpt::new`'s losses and gradients to the bit, and its counts
//! show every kernel and memory operation of a step went through the trait; declaring a
//! kernel scratch, it is handed one by the activations before it runs anything.
//!
//! Legend: L layers, B batch, T sequence.

// The llm.c signature (outputs, inputs, then every dimension) is the trait's.
#![allow(clippy::too_many_arguments)]

use std::collections::BTreeMap;
use std::sync::Mutex;

use zero_gpt::{
    init_params, Activations, Backend, Buffer, CpuBackend, Gpt, GptConfig, GptError, KeptBy,
    BACKEND_SCRATCH,
};

const B: usize = 2;
const T: usize = 8;

/// The CPU kernels behind a different type, counting calls by method name; it may declare
/// a kernel scratch, which it then checks it was given before any call but `alloc`.
#[derive(Debug, Default)]
struct Counting {
    calls: Mutex<BTreeMap<&'static str, usize>>,
    /// f32 elements of scratch declared ([`Backend::scratch_len`]); 0 for none.
    scratch: usize,
    /// The length of the scratch provided, once it was.
    provided: Mutex<Option<usize>>,
}

impl Counting {
    fn with_scratch(scratch: usize) -> Self {
        Self {
            scratch,
            ..Self::default()
        }
    }
    fn hit(&self, name: &'static str) {
        if self.scratch > 0 && name != "alloc" {
            let provided = *self.provided.lock().unwrap();
            assert_eq!(provided, Some(self.scratch), "{name} before the scratch");
        }
        *self.calls.lock().unwrap().entry(name).or_default() += 1;
    }
    fn count(&self, name: &str) -> usize {
        self.calls.lock().unwrap().get(name).copied().unwrap_or(0)
    }
    fn reset(&self) {
        self.calls.lock().unwrap().clear();
    }
}

/// Each method counts its name, then runs the CPU kernel with the same arguments.
macro_rules! counted {
    ($($name:ident($($arg:ident: $ty:ty),*);)*) => {
        $(fn $name(&self, $($arg: $ty),*) {
            self.hit(stringify!($name));
            CpuBackend.$name($($arg),*)
        })*
    };
}

impl Backend for Counting {
    type Slice = [f32];
    type Ids = [u32];

    fn alloc(&self, len: usize) -> zero_gpt::Result<Buffer> {
        self.hit("alloc");
        CpuBackend.alloc(len)
    }
    fn ids(view: &[f32]) -> &[u32] {
        CpuBackend::ids(view)
    }
    fn ids_mut(view: &mut [f32]) -> &mut [u32] {
        CpuBackend::ids_mut(view)
    }
    fn mean(&self, x: &[f32]) -> zero_gpt::Result<f32> {
        self.hit("mean");
        CpuBackend.mean(x)
    }
    fn scratch_len(&self, _: &GptConfig, _: usize, _: usize) -> zero_gpt::Result<usize> {
        Ok(self.scratch)
    }
    fn provide_scratch(&self, scratch: Buffer) {
        *self.provided.lock().unwrap() = Some(scratch.floats().len());
        self.hit("provide_scratch");
    }
    counted! {
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

fn batch(vocab: u32) -> (Vec<u32>, Vec<u32>) {
    let tokens = (0..B * T).map(|i| (i as u32 * 7 + 3) % vocab).collect();
    let targets = (0..B * T).map(|i| (i as u32 * 11 + 5) % vocab).collect();
    (tokens, targets)
}

/// (loss, gradients) of two micro-steps (the second accumulating) of `model`, whose backend
/// works on host slices.
fn two_steps<K: Backend<Slice = [f32]>>(
    model: &Gpt<K>,
    every: Option<usize>,
) -> (Vec<f32>, Vec<Vec<f32>>) {
    let params = init_params(model.config(), model.layout(), 7);
    let mut grads: Vec<Vec<f32>> = model
        .layout()
        .unit_lens()
        .iter()
        .map(|&n| vec![0.0; n])
        .collect();
    let mut acts = model.activations_checkpointed(B, T, every).unwrap();
    let (tokens, targets) = batch(100);
    let losses = (0..2)
        .map(|_| {
            model
                .forward_backward(&mut acts, &params, &mut grads, &tokens, &targets)
                .unwrap()
        })
        .collect();
    (losses, grads)
}

/// The same on the CPU model.
fn cpu_step(every: Option<usize>) -> (Vec<f32>, Vec<Vec<f32>>) {
    two_steps(&Gpt::new(GptConfig::tiny()).unwrap(), every)
}

fn counting_step(model: &Gpt<Counting>, every: Option<usize>) -> (Vec<f32>, Vec<Vec<f32>>) {
    two_steps(model, every)
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn a_counting_backend_gives_the_cpu_models_losses_and_gradients_to_the_bit() {
    for every in [None, Some(1)] {
        let model = Gpt::with_backend(GptConfig::tiny(), Counting::default()).unwrap();
        let (want_losses, want_grads) = cpu_step(every);
        let (losses, grads) = counting_step(&model, every);
        assert_eq!(bits(&losses), bits(&want_losses), "losses, every {every:?}");
        assert!(losses[0].is_finite() && losses[0] > 0.0);
        for (unit, (g, w)) in grads.iter().zip(&want_grads).enumerate() {
            assert_eq!(bits(g), bits(w), "unit {unit} gradient, every {every:?}");
            assert!(g.iter().any(|&x| x != 0.0), "unit {unit} got no gradient");
        }
    }
}

#[test]
fn every_kernel_of_a_step_runs_through_the_backend() {
    let model = Gpt::with_backend(GptConfig::tiny(), Counting::default()).unwrap();
    let l = model.config().num_layers;
    let params = init_params(model.config(), model.layout(), 7);
    let mut grads: Vec<Vec<f32>> = model
        .layout()
        .unit_lens()
        .iter()
        .map(|&n| vec![0.0; n])
        .collect();
    let mut acts = model.activations(B, T).unwrap();
    assert_eq!(
        model.backend().count("alloc"),
        6,
        "one per activation buffer"
    );
    model.backend().reset();
    let (tokens, targets) = batch(100);
    model
        .forward_backward(&mut acts, &params, &mut grads, &tokens, &targets)
        .unwrap();
    // One micro-step, counted from the architecture: per block 2 LayerNorms, 4 matrix
    // products, attention, GELU and 2 residual adds; the head 1 LayerNorm and 1 product.
    let want = [
        ("upload_ids", 2), // tokens, then targets
        ("mean", 1),       // the loss
        ("encoder_forward", 1),
        ("encoder_backward", 1),
        ("layernorm_forward", 2 * l + 1),
        ("layernorm_backward", 2 * l + 1),
        ("matmul_forward", 4 * l + 1),
        ("matmul_backward", 4 * l),
        ("matmul_backward_input", 1), // the tied head, in two halves
        ("matmul_backward_weight", 1),
        ("attention_forward", l),
        ("attention_backward", l),
        ("gelu_forward", l),
        ("gelu_backward", l),
        ("residual_forward", 2 * l),
        ("residual_backward", 0), // LayerNorm backward adds into the residual gradient
        ("crossentropy_forward", 1),
        ("crossentropy_backward", 1),
        ("copy", 0), // no checkpointing
        ("alloc", 0),
    ];
    for (name, n) in want {
        assert_eq!(model.backend().count(name), n, "{name}");
    }
    // Backward scratch: 5 zeroed per block and dln once more; dln and dres in the head.
    assert_eq!(model.backend().count("fill"), 6 * l + 2);
}

#[test]
fn checkpointing_moves_block_inputs_through_the_backend() {
    let model = Gpt::with_backend(GptConfig::tiny(), Counting::default()).unwrap();
    let l = model.config().num_layers;
    counting_step(&model, Some(1));
    // Per micro-step: forward keeps every segment's input (L copies, L-1 moves into the
    // input slot); backward restores the L-1 recomputed segments; two micro-steps.
    assert_eq!(model.backend().count("copy"), 2 * (l + (l - 1) + (l - 1)));
    // The recomputed blocks run their forward again: L + (L-1) attention forwards a step.
    assert_eq!(model.backend().count("attention_forward"), 2 * (2 * l - 1));
}

#[test]
fn logits_come_from_the_backend_memory_as_on_the_cpu() {
    let cpu = Gpt::new(GptConfig::tiny()).unwrap();
    let counting = Gpt::with_backend(GptConfig::tiny(), Counting::default()).unwrap();
    let params = init_params(cpu.config(), cpu.layout(), 3);
    let (tokens, _) = batch(100);
    let mut a = cpu.activations(B, T).unwrap();
    let mut b = counting.activations(B, T).unwrap();
    cpu.forward(&mut a, &params, &tokens, None).unwrap();
    counting.forward(&mut b, &params, &tokens, None).unwrap();
    let (want, got) = (cpu.logits(&a).unwrap(), counting.logits(&b).unwrap());
    assert_eq!(bits(got), bits(want));
    assert_eq!(
        counting.backend().count("mean"),
        0,
        "no loss without targets"
    );
}

/// Scratch this test backend declares, in f32 elements (any non-zero length).
const SCRATCH: usize = 37;

#[test]
fn a_declared_scratch_is_asked_for_first_and_provided_before_anything_runs() {
    let model = Gpt::with_backend(GptConfig::tiny(), Counting::with_scratch(SCRATCH)).unwrap();
    let mut asked = Vec::new();
    let alloc = |index, len| {
        asked.push((index, len));
        model.backend().alloc(len)
    };
    // Every call the construction makes (the buffers' fills) checks the scratch came first.
    Activations::with_backend_memory(
        model.backend(),
        model.config(),
        B,
        T,
        None,
        alloc,
        KeptBy::Model,
    )
    .unwrap();
    assert_eq!(asked.len(), 7, "six buffers and the scratch: {asked:?}");
    assert_eq!(asked[0], (BACKEND_SCRATCH, SCRATCH));
    assert!(asked[1..].iter().all(|&(index, _)| index < BACKEND_SCRATCH));
    assert_eq!(model.backend().count("provide_scratch"), 1);
    // A whole step on fresh activations, every kernel checking: the CPU model's bits.
    let (losses, grads) = counting_step(&model, Some(1));
    let (want_losses, want_grads) = cpu_step(Some(1));
    assert_eq!(bits(&losses), bits(&want_losses));
    assert!(grads
        .iter()
        .zip(&want_grads)
        .all(|(g, w)| bits(g) == bits(w)));
    assert_eq!(model.backend().count("provide_scratch"), 2);
}

#[test]
fn a_scratch_of_another_length_is_refused() {
    let model = Gpt::with_backend(GptConfig::tiny(), Counting::with_scratch(SCRATCH)).unwrap();
    let short = |index, len| {
        model
            .backend()
            .alloc(len - usize::from(index == BACKEND_SCRATCH))
    };
    let err = Activations::with_backend_memory(
        model.backend(),
        model.config(),
        B,
        T,
        None,
        short,
        KeptBy::Model,
    )
    .unwrap_err();
    assert!(
        matches!(err, GptError::SizeMismatch { what: "backend scratch", expected: SCRATCH, got } if got == SCRATCH - 1),
        "{err}"
    );
    assert_eq!(model.backend().count("provide_scratch"), 0);
}

#[test]
fn the_cpu_backend_declares_no_scratch() {
    let model = Gpt::new(GptConfig::tiny()).unwrap();
    assert_eq!(
        model.backend().scratch_len(model.config(), B, T).unwrap(),
        0
    );
    let mut asked = Vec::new();
    let alloc = |index, len| {
        asked.push(index);
        CpuBackend.alloc(len)
    };
    Activations::with_backend_memory(
        &CpuBackend,
        model.config(),
        B,
        T,
        None,
        alloc,
        KeptBy::Model,
    )
    .unwrap();
    assert_eq!(asked, [0, 1, 2, 3, 4, 5]);
}

/// `Gpt<CudaBackend>` and its activations in device memory; skips without a driver (a
/// failure under `ZERO_GPT_REQUIRE_GPU=1`). Has not run on a GPU yet.
#[cfg(feature = "cuda")]
#[test]
fn a_cuda_model_and_its_activations_build_where_a_gpu_is() {
    use zero_gpt::cuda::CudaBackend;
    let backend = match CudaBackend::new(0) {
        Ok(backend) => backend,
        Err(e) => {
            assert!(
                std::env::var("ZERO_GPT_REQUIRE_GPU").as_deref() != Ok("1"),
                "ZERO_GPT_REQUIRE_GPU=1 but {e}"
            );
            println!("skipped: {e}");
            return;
        }
    };
    let model = Gpt::with_backend(GptConfig::tiny(), backend).unwrap();
    let acts = model.activations_checkpointed(B, T, Some(1)).unwrap();
    assert_eq!(acts.batch(), B);
    assert!(acts.bytes() > 0);
}
