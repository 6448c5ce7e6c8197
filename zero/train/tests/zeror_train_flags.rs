//! `--activation-checkpointing` through `zero-train`: the same losses to the bit, smaller
//! activations in the summary, the activations counted in the arena peak, and a
//! `--memory-limit` below the plan refused at start-up naming what fits.

mod common;
use common::{write_corpus, TempDir};
use std::path::Path;
use zero::ZeroStage;
use zero_gpt::{activation_bytes, GptConfig, Rng};
use zero_train::{train, ByteSize, TrainConfig};

/// train.bin and val.bin of random tokens below 100.
fn corpus(dir: &Path) {
    let mut rng = Rng::new(9);
    let tokens: Vec<u16> = (0..6_000).map(|_| (rng.next_u64() % 100) as u16).collect();
    write_corpus(dir, &tokens, 2_000, 100);
}

/// The tiny preset, 3 layers, on 2 ranks at stage 3 for 3 steps.
fn tiny(data: &Path) -> TrainConfig {
    TrainConfig {
        model: "tiny".into(),
        layers: Some(3),
        seq_len: 16,
        data: data.to_path_buf(),
        world_size: 2,
        steps: 3,
        batch_size: 2,
        micro_batch_size: 1,
        eval_every: 0,
        sample_tokens: 0,
        zero_stage: ZeroStage::Zero3,
        ..TrainConfig::default()
    }
}

#[test]
fn checkpointing_keeps_the_losses_and_shrinks_the_activations() {
    let dir = TempDir::new("flags");
    corpus(&dir.0);
    let plain = train(&tiny(&dir.0)).unwrap();
    let checkpointed = train(&TrainConfig {
        activation_checkpointing: true,
        ..tiny(&dir.0)
    })
    .unwrap();
    let bits = |l: &[f32]| l.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&plain.losses), bits(&checkpointed.losses));
    let model = GptConfig::new(32, 100, 3, 2, 32).unwrap();
    let (a, b) = (&plain.ranks[0], &checkpointed.ranks[0]);
    assert_eq!(
        a.activation_bytes,
        activation_bytes(&model, 1, 16, None).unwrap()
    );
    // zero-gpt's formula counts an input per segment (3); the engine keeps those of the
    // recomputed segments, all but the last.
    let input = 16 * 32 * 4;
    assert_eq!(
        b.activation_bytes,
        activation_bytes(&model, 1, 16, Some(1)).unwrap() - input
    );
    assert!(b.activation_bytes < a.activation_bytes);
    // The activations are arena blocks: the peak holds them beside the model states. (Peaks
    // are not compared between runs: how many gradient buckets are in flight at once
    // depends on thread timing.)
    for r in [a, b] {
        assert!(r.peak_bytes as f64 >= r.measured.total() + r.activation_bytes as f64);
    }
    let offloaded = train(&TrainConfig {
        activation_checkpointing: true,
        offload_activations: true,
        ..tiny(&dir.0)
    })
    .unwrap();
    assert_eq!(bits(&plain.losses), bits(&offloaded.losses));
}

#[test]
fn offload_without_checkpointing_is_refused() {
    let dir = TempDir::new("offload");
    corpus(&dir.0);
    let err = train(&TrainConfig {
        offload_activations: true,
        ..tiny(&dir.0)
    })
    .unwrap_err()
    .to_string();
    assert!(err.contains("--activation-checkpointing"), "{err}");
}

#[test]
fn a_cap_below_the_plan_is_refused_naming_what_fits() {
    let dir = TempDir::new("cap");
    corpus(&dir.0);
    let err = train(&TrainConfig {
        zero_stage: ZeroStage::Zero0,
        memory_limit: Some(ByteSize(1 << 20)),
        ..tiny(&dir.0)
    })
    .unwrap_err()
    .to_string();
    assert!(err.contains("stage 0 needs"), "{err}");
    assert!(err.contains("--memory-limit is 1048576 bytes"), "{err}");
    assert!(
        err.contains("fits (") || err.contains("nothing fits"),
        "{err}"
    );
}
