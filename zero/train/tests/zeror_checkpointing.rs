//! ZeRO-R activation checkpointing: training with it gives the losses and parameters of
//! training without it, to the bit, at every stage; and its activation memory is the
//! closed-form count written out below.

use zero::{EngineConfig, KeptInputs, ZeroStage};
use zero_gpt::{activation_bytes, init_unit, Gpt, GptConfig, Rng};
use zero_train::bridge::{full_params, gpt_engine, heap_activations, micro_step};

const T: usize = 8;
const STEPS: usize = 2;

/// L=3 (so segments of 2 blocks leave a short last segment), NH=2, C=32, V=64.
fn config() -> GptConfig {
    GptConfig::new(T, 64, 3, 2, 32).unwrap()
}

/// Rank `rank`'s (tokens, targets) at step `step`: one sequence.
fn batch(step: usize, rank: usize) -> (Vec<u32>, Vec<u32>) {
    let mut rng = Rng::new((step * 16 + rank) as u64 + 5);
    let seq: Vec<u32> = (0..=T).map(|_| (rng.next_u64() % 64) as u32).collect();
    (seq[..T].to_vec(), seq[1..].to_vec())
}

/// Rank 0's per-step losses and final parameters, as bits.
fn train(world: usize, stage: ZeroStage, every: Option<usize>) -> (Vec<u32>, Vec<u32>) {
    let cfg = config();
    let engine_config = EngineConfig {
        stage,
        kept_inputs: KeptInputs {
            len: T * cfg.channels,
            offload: false,
            partitions: 1,
        },
        ..EngineConfig::default()
    };
    let comms = zero_comm::local::create(world).unwrap();
    let mut runs: Vec<(Vec<u32>, Vec<u32>)> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|comm| {
                s.spawn(move || {
                    let model = Gpt::new(cfg).unwrap();
                    let layout = model.layout().clone();
                    let mut engine = gpt_engine(comm, &layout, every, engine_config, |unit, w| {
                        init_unit(&cfg, &layout, unit, 3, w).unwrap()
                    })
                    .unwrap();
                    let mut acts = heap_activations(&cfg, 1, T, every).unwrap();
                    let mut losses = Vec::new();
                    for step in 0..STEPS {
                        let (x, y) = batch(step, engine.rank());
                        let loss = micro_step(&mut engine, &model, &mut acts, &x, &y).unwrap();
                        losses.push(loss.to_bits());
                        engine.step(1e-2).unwrap();
                    }
                    let params = full_params(&mut engine).unwrap();
                    (
                        losses,
                        params.iter().flatten().map(|x| x.to_bits()).collect(),
                    )
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    runs.swap_remove(0)
}

#[test]
fn checkpointing_changes_no_bit_at_any_stage() {
    for world in [1, 2] {
        for stage in ZeroStage::ALL {
            let plain = train(world, stage, None);
            assert_ne!(plain.0[0], plain.0[STEPS - 1], "training moved nothing");
            for every in [1, 2, 3] {
                let checkpointed = train(world, stage, Some(every));
                assert!(
                    checkpointed == plain,
                    "{stage}, N={world}, checkpoint every {every}: results differ"
                );
            }
        }
    }
}

/// The activation count written out from the model's buffers, independently of the code:
/// per layer region ln1, attproj, res2, ln2, fcproj, res3, atty (N,C), qkv (N,3C), fch,
/// fch_gelu (N,4C), four (N,) statistics and att (B,NH,T,T); the head lnf (N,C), two (N,)
/// statistics, logits (N,Vp), losses (N,); the backward scratch dres, dln, datty (N,C), dqkv
/// (N,3C), dfch, dfch_gelu (N,4C); the embedding output (N,C); tokens, targets, dlosses (N,).
/// Checkpointing every K keeps min(K,L) regions and ceil(L/K) inputs (N,C).
fn expected_bytes(cfg: &GptConfig, b: usize, t: usize, every: Option<usize>) -> u64 {
    let (n, c, l) = (b * t, cfg.channels, cfg.num_layers);
    let layer = 7 * n * c + 3 * n * c + 8 * n * c + 4 * n + b * cfg.num_heads * t * t;
    let head = n * c + 2 * n + n * cfg.padded_vocab_size + n;
    let scratch = 3 * n * c + 3 * n * c + 8 * n * c;
    let (regions, kept) = match every {
        None => (l, 0),
        Some(k) => (k.min(l), l.div_ceil(k) * n * c),
    };
    4 * (n * c + regions * layer + head + scratch + kept + 3 * n) as u64
}

#[test]
fn activation_bytes_are_the_formula_and_checkpointing_shrinks_them() {
    let cfg = GptConfig::new(16, 64, 5, 2, 32).unwrap();
    let model = Gpt::new(cfg).unwrap();
    for (b, t) in [(1, 8), (2, 16)] {
        for every in [None, Some(1), Some(2), Some(5), Some(7)] {
            let acts = model.activations_checkpointed(b, t, every).unwrap();
            let expected = expected_bytes(&cfg, b, t, every);
            assert_eq!(acts.bytes(), expected, "B={b} T={t} every={every:?}");
            assert_eq!(activation_bytes(&cfg, b, t, every).unwrap(), expected);
        }
        let plain = expected_bytes(&cfg, b, t, None);
        assert!(expected_bytes(&cfg, b, t, Some(1)) < plain);
    }
    assert!(model.activations_checkpointed(1, 8, Some(0)).is_err());
}
