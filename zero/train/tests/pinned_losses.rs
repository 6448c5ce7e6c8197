//! Losses, evaluation losses and the exported parameters of short zero-train runs, pinned to
//! the bits the trainer produced before its micro-step became a program the engine runs
//! (commit 561856f): every stage, fp32 and bf16, with and without activation checkpointing,
//! activation offload and optimizer offload.
//!
//! The pins were printed by this file's `ZERO_PRINT_PINS=1` mode (`cargo test -p zero-train
//! --test pinned_losses -- --nocapture`) run against that commit's binary; a change that moves
//! any bit of a loss or a parameter fails here.

mod common;
use common::{learnable_corpus, TempDir};
use std::process::Command;

/// (extra flags, per-step losses, evaluation losses, FNV-1a 64 of the llm.c export).
type Pin = (&'static [&'static str], [u32; 2], [u32; 3], u64);

const PINS: &[Pin] = &[
    (
        &["--zero-stage", "0"],
        [0x40945298, 0x408b8c21],
        [0x4093b342, 0x408b54da, 0x40844181],
        0xe2a4210318302c0d,
    ),
    (
        &["--zero-stage", "1"],
        [0x40945298, 0x408b8c21],
        [0x4093b342, 0x408b54da, 0x40844181],
        0xe2a4210318302c0d,
    ),
    (
        &["--zero-stage", "2"],
        [0x40945298, 0x408b8c21],
        [0x4093b342, 0x408b54da, 0x40844181],
        0xe2a4210318302c0d,
    ),
    (
        &["--zero-stage", "3"],
        [0x40945298, 0x408b8c21],
        [0x4093b342, 0x408b54da, 0x40844181],
        0xe2a4210318302c0d,
    ),
    (
        &["--zero-stage", "0", "--precision", "bf16"],
        [0x4094522a, 0x408b89bc],
        [0x4093b2e6, 0x408b51a4, 0x40844106],
        0x29a50d5c61d8889f,
    ),
    (
        &["--zero-stage", "3", "--precision", "bf16"],
        [0x4094522a, 0x408b89bc],
        [0x4093b2e6, 0x408b51a4, 0x40844106],
        0x29a50d5c61d8889f,
    ),
    (
        &[
            "--zero-stage",
            "2",
            "--activation-checkpointing",
            "--checkpoint-every",
            "1",
        ],
        [0x40945298, 0x408b8c21],
        [0x4093b342, 0x408b54da, 0x40844181],
        0xe2a4210318302c0d,
    ),
    (
        &[
            "--zero-stage",
            "3",
            "--activation-checkpointing",
            "--offload-activations",
        ],
        [0x40945298, 0x408b8c21],
        [0x4093b342, 0x408b54da, 0x40844181],
        0xe2a4210318302c0d,
    ),
    (
        &[
            "--zero-stage",
            "1",
            "--precision",
            "bf16",
            "--offload-optimizer",
        ],
        [0x4094522a, 0x408b89bc],
        [0x4093b2e6, 0x408b51a4, 0x40844106],
        0x29a50d5c61d8889f,
    ),
];

/// FNV-1a 64 over `bytes`.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Runs zero-train with `extra` and returns (losses, evaluation losses, export hash).
fn run(dir: &std::path::Path, extra: &[&str]) -> (Vec<u32>, Vec<u32>, u64) {
    let (metrics, export) = (dir.join("m.jsonl"), dir.join("final.bin"));
    let out = Command::new(env!("CARGO_BIN_EXE_zero-train"))
        .args([
            "--model",
            "tiny",
            "--seq-len",
            "16",
            "--steps",
            "2",
            "--world-size",
            "2",
        ])
        .args([
            "--batch-size",
            "4",
            "--micro-batch-size",
            "1",
            "--eval-every",
            "1",
        ])
        .args([
            "--eval-batches",
            "1",
            "--sample-tokens",
            "0",
            "--lr",
            "1e-2",
        ])
        .arg("--data")
        .arg(dir)
        .arg("--metrics")
        .arg(&metrics)
        .arg("--export-llmc")
        .arg(&export)
        .args(extra)
        .output()
        .unwrap();
    assert!(out.status.success(), "{extra:?}: {}", common::stderr(&out));
    let (mut losses, mut evals) = (vec![], vec![]);
    for line in std::fs::read_to_string(&metrics).unwrap().lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let bits = |key: &str| {
            v.get(key)
                .and_then(|x| x.as_f64())
                .map(|x| (x as f32).to_bits())
        };
        losses.extend(bits("loss"));
        evals.extend(bits("val_loss"));
    }
    (losses, evals, fnv1a(&std::fs::read(&export).unwrap()))
}

#[test]
fn short_runs_give_the_pinned_bits() {
    let dir = TempDir::new("pinned");
    learnable_corpus(&dir.0);
    if std::env::var_os("ZERO_PRINT_PINS").is_some() {
        for &(extra, ..) in PINS {
            let (l, e, h) = run(&dir.0, extra);
            let hex = |v: &[u32]| v.iter().map(|b| format!("{b:#010x}")).collect::<Vec<_>>();
            println!("    (&{extra:?}, {:?}, {:?}, {h:#018x}),", hex(&l), hex(&e));
        }
        return;
    }
    for &(extra, losses, evals, hash) in PINS {
        let got = run(&dir.0, extra);
        assert_eq!(got.0, losses, "{extra:?}: losses");
        assert_eq!(got.1, evals, "{extra:?}: evaluation losses");
        assert_eq!(got.2, hash, "{extra:?}: exported parameters");
    }
}
