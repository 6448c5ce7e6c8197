//! A `zero-train` process killed with SIGKILL at seeded random moments while it saves after
//! every step always leaves a state that verifies and resumes: a save is published only by
//! renames after everything it holds is synced, and `latest` only ever names a complete one.

mod common;
use common::write_corpus;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;
use zero_gpt::Rng;
use zero_state::verify_state;
use zero_train::{train, TrainConfig};

fn corpus(dir: &Path) {
    let mut rng = Rng::new(5);
    let tokens: Vec<u16> = (0..8_000).map(|_| (rng.next_u64() % 100) as u16).collect();
    write_corpus(dir, &tokens, 2_000, 100);
}

/// The tiny model at 2 ranks, stage 3, saving after every step and keeping 2 states.
fn flags(data: &Path, save: &Path, steps: u64) -> Vec<String> {
    let mut args: Vec<String> = [
        "--model",
        "tiny",
        "--seq-len",
        "16",
        "--world-size",
        "2",
        "--zero-stage",
        "3",
        "--batch-size",
        "4",
        "--micro-batch-size",
        "1",
        "--warmup-steps",
        "2",
        "--eval-every",
        "0",
        "--sample-tokens",
        "0",
        "--save-every",
        "1",
        "--keep-last",
        "2",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(["--steps".into(), steps.to_string()]);
    args.extend(["--data".into(), data.display().to_string()]);
    args.extend(["--save".into(), save.display().to_string()]);
    args
}

#[test]
fn sigkill_during_saves_always_leaves_a_loadable_state() {
    let dir = std::env::temp_dir().join(format!("zero-crash-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    corpus(&dir);
    let save = dir.join("ckpt");
    let exe = env!("CARGO_BIN_EXE_zero-train");
    let first = Command::new(exe)
        .args(flags(&dir, &save, 2))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(first.success());
    let mut last_step = verify_state(&save).unwrap().1;
    assert_eq!(last_step, 2);
    let mut rng = Rng::new(2024);
    for attempt in 0..8 {
        let delay = Duration::from_millis(30 + rng.next_u64() % 400);
        let mut child = Command::new(exe)
            .args(flags(&dir, &save, 1_000_000))
            .args(["--resume".to_string(), save.display().to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(delay);
        child.kill().unwrap(); // SIGKILL on Unix
        child.wait().unwrap();
        let (state, step) = verify_state(&save)
            .unwrap_or_else(|e| panic!("attempt {attempt} (killed after {delay:?}): {e}"));
        assert!(
            step >= last_step,
            "attempt {attempt}: step {step} < {last_step}"
        );
        assert!(!state.to_string_lossy().ends_with(".partial"));
        last_step = step;
        eprintln!("attempt {attempt}: killed after {delay:?}, latest complete state: step {step}");
    }
    // And the state resumes: one more step in this process.
    let resumed = train(&TrainConfig {
        model: "tiny".into(),
        seq_len: 16,
        data: dir.clone(),
        world_size: 2,
        zero_stage: zero::ZeroStage::Zero3,
        batch_size: 4,
        micro_batch_size: 1,
        warmup_steps: 2,
        eval_every: 0,
        sample_tokens: 0,
        steps: last_step + 1,
        resume: Some(save.clone()),
        ..TrainConfig::default()
    })
    .unwrap();
    assert_eq!(resumed.losses.len(), 1);
    std::fs::remove_dir_all(dir).ok();
}
