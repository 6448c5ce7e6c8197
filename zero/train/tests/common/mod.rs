//! Helpers shared by zero-train's integration tests: a temporary folder, token files and
//! model parameters.
// Each test binary compiles this module and uses part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use zero_gpt::{GptConfig, ParamLayout};
use zero_train::data::TokenFile;

/// A fresh folder under the system's temporary directory, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// `tag` keeps the folders of one binary's tests apart; the process id keeps runs apart.
    pub fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!("zero-train-test-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Self(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Writes `val.bin` (the first `val` tokens) and `train.bin` (the rest) into `dir`.
pub fn write_corpus(dir: &Path, tokens: &[u16], val: usize, vocab: u32) {
    let (val, train) = tokens.split_at(val);
    for (name, part) in [("train.bin", train), ("val.bin", val)] {
        TokenFile::from_tokens_with_vocab(part.to_vec(), vocab)
            .unwrap()
            .write(dir.join(name))
            .unwrap();
    }
}

/// train.bin and val.bin of 6,000 random tokens below 100 drawn from `seed` (2,000 of
/// them in val.bin), and an empty folder `nvme` beside them for the file tiers.
pub fn offload_corpus(dir: &Path, seed: u64) {
    let mut rng = zero_gpt::Rng::new(seed);
    let tokens: Vec<u16> = (0..6_000).map(|_| (rng.next_u64() % 100) as u16).collect();
    write_corpus(dir, &tokens, 2_000, 100);
    std::fs::create_dir(dir.join("nvme")).unwrap();
}

/// The bits of some losses, to compare runs exactly.
pub fn loss_bits(l: &[f32]) -> Vec<u32> {
    l.iter().map(|x| x.to_bits()).collect()
}

/// The `zero-train` binary on the tiny preset cut to 2 layers of 16 tokens, 2 ranks, 1 step,
/// no evaluation or sample, on the corpus in `data`, with `flags`: (success, stderr).
pub fn tiny_zero_train(data: &Path, flags: &[&str]) -> (bool, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_zero-train"))
        .args(["--model", "tiny", "--layers", "2", "--seq-len", "16"])
        .args(["--steps", "1", "--world-size", "2", "--eval-every", "0"])
        .args(["--sample-tokens", "0", "--data", data.to_str().unwrap()])
        .args(flags)
        .output()
        .unwrap();
    (out.status.success(), stderr(&out))
}

/// train.bin and val.bin of a learnable stream: a repeating pattern with noise (vocab 100).
pub fn learnable_corpus(dir: &Path) {
    let mut rng = zero_gpt::Rng::new(3);
    let tokens: Vec<u16> = (0..20_000)
        .map(|i| {
            if rng.next_u64() % 8 == 0 {
                (rng.next_u64() % 100) as u16
            } else {
                (i % 17) as u16
            }
        })
        .collect();
    write_corpus(dir, &tokens, 4_000, 100);
}

/// Units with distinct, arbitrary values everywhere but the padded vocabulary rows.
pub fn model_units(cfg: &GptConfig, seed: u32) -> Vec<Vec<f32>> {
    let layout = ParamLayout::new(cfg);
    let mut k = seed;
    let mut units: Vec<Vec<f32>> = layout
        .unit_lens()
        .iter()
        .map(|&n| {
            (0..n)
                .map(|_| {
                    k = k.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    f32::from_bits((k >> 9) | 0x3f00_0000) - 1.25
                })
                .collect()
        })
        .collect();
    units[0][cfg.vocab_size * cfg.channels..cfg.padded_vocab_size * cfg.channels].fill(0.0);
    units
}

/// A zero-train command line: `flags` as they are, then each `(flag, path)` pair.
pub fn command_line(flags: &[&str], paths: &[(&str, &Path)]) -> Vec<String> {
    let mut line: Vec<String> = flags.iter().map(|s| s.to_string()).collect();
    for (flag, path) in paths {
        line.extend([flag.to_string(), path.display().to_string()]);
    }
    line
}

/// A finished process's standard error, as text.
pub fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The tiny preset cut to 2 layers of 16 tokens, at stage 3 on 2 ranks for 4 steps of 2
/// sequences (one per rank), no evaluation or sample: the offload tests' run.
pub fn tiny_stage3(data: &Path) -> zero_train::TrainConfig {
    zero_train::TrainConfig {
        model: "tiny".into(),
        layers: Some(2),
        seq_len: 16,
        data: data.to_path_buf(),
        world_size: 2,
        steps: 4,
        batch_size: 2,
        micro_batch_size: 1,
        eval_every: 0,
        sample_tokens: 0,
        zero_stage: zero::ZeroStage::Zero3,
        ..zero_train::TrainConfig::default()
    }
}
