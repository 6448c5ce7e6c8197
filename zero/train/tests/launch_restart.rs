//! `zero-train launch`: a rank killed at step 3 of 6 is restarted from the newest complete
//! state and the run ends with the unbroken run's states and losses, to the bit; without a
//! restart budget the launch fails naming the cause; a rank that fails every time spends the
//! budget and stops; a rank that keeps failing shrinks the world, which still ends within the
//! elastic resume's tolerance. The unbroken reference is the local backend (threads of one
//! process, no launcher).

mod common;
use common::{command_line, learnable_corpus, stderr, TempDir};

use std::path::Path;
use std::process::{Command, Output};

/// The tiny model, 6 steps, saving after every step.
fn flags(data: &Path, save: &Path, metrics: &Path) -> Vec<String> {
    let list = [
        "--model",
        "tiny",
        "--seq-len",
        "16",
        "--steps",
        "6",
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
        "--comm-timeout",
        "10",
        "--save-every",
        "1",
    ];
    command_line(
        &list,
        &[("--data", data), ("--save", save), ("--metrics", metrics)],
    )
}

fn zero_train(args: &[String]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_zero-train"))
        .args(args)
        .output()
        .unwrap()
}

/// `zero-train launch LAUNCH -- TRAIN`.
fn launch(launch: &[&str], train: &[String]) -> Output {
    let mut args: Vec<String> = ["launch"]
        .iter()
        .chain(launch)
        .map(|s| s.to_string())
        .collect();
    args.push("--".into());
    args.extend(train.iter().cloned());
    zero_train(&args)
}

/// The unbroken run: 2 rank threads, saving into `dir/unbroken`.
fn unbroken(dir: &Path) {
    let mut a = flags(dir, &dir.join("unbroken"), &dir.join("unbroken.jsonl"));
    a.extend(["--backend", "local", "--world-size", "2"].map(String::from));
    let out = zero_train(&a);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn losses(metrics: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(metrics).unwrap_or_default();
    text.lines()
        .filter_map(|line| line.split("\"loss\":").nth(1))
        .map(|rest| rest.split([',', '}']).next().unwrap_or("").to_string())
        .collect()
}

#[test]
fn a_rank_killed_at_step_3_of_6_restarts_and_ends_equal_to_the_unbroken_run_to_the_bit() {
    let dir = TempDir::new("launch-kill-3");
    learnable_corpus(&dir.0);
    unbroken(&dir.0);
    let save = dir.0.join("restarted");
    let mut train = flags(&dir.0, &save, &dir.0.join("restarted.jsonl"));
    train.extend(["--inject-fault", "kill:rank=1,step=3"].map(String::from));
    let out = launch(&["--nproc-per-node", "2", "--max-restarts", "1"], &train);
    let text = stderr(&out);
    assert!(out.status.success(), "{text}");
    for needle in [
        "injected fault kill on rank 1 at",
        "attempt 0 (2 ranks) failed",
        "rank 1 exited with status 137 (killed)",
        "restart 1 of 1 with 2 ranks from",
        "step-000003",
        "resumed from",
        "finished with 2 ranks after 1 restart(s)",
    ] {
        assert!(text.contains(needle), "no {needle:?} in:\n{text}");
    }
    // Parameters and both Adam moments of every rank, byte for byte.
    for rank in ["rank-00000.bin", "rank-00001.bin"] {
        let want = std::fs::read(dir.0.join("unbroken/step-000006").join(rank)).unwrap();
        let got = std::fs::read(save.join("step-000006").join(rank)).unwrap();
        assert!(
            want == got,
            "{rank} of step 6 differs from the unbroken run's"
        );
    }
    // The restarted attempt reports steps 4 to 6 (its metrics file starts afresh).
    let want = losses(&dir.0.join("unbroken.jsonl"));
    assert_eq!(want.len(), 6);
    assert_eq!(losses(&dir.0.join("restarted.jsonl")), want[3..]);
}

#[test]
fn without_a_restart_budget_the_launch_fails_naming_the_cause() {
    let dir = TempDir::new("launch-no-budget");
    learnable_corpus(&dir.0);
    let mut train = flags(&dir.0, &dir.0.join("ckpt"), &dir.0.join("m.jsonl"));
    train.extend(["--inject-fault", "kill:rank=1,step=3"].map(String::from));
    let out = launch(&["--nproc-per-node", "2", "--max-restarts", "0"], &train);
    let text = stderr(&out);
    assert!(
        !out.status.success() && !text.contains("panicked"),
        "{text}"
    );
    for needle in [
        "attempt 0 (2 ranks) failed after",
        "rank 1 exited with status 137 (killed) (then: rank 0 exited with status 1)",
        "the restart budget (--max-restarts 0) is spent",
    ] {
        assert!(text.contains(needle), "no {needle:?} in:\n{text}");
    }
    // The survivor's own report names the dead peer.
    assert!(
        text.contains("failed on rank 0") && text.contains("rank 1"),
        "{text}"
    );
}

#[test]
fn a_rank_that_fails_every_time_spends_the_budget_and_stops() {
    let dir = TempDir::new("launch-always-fails");
    learnable_corpus(&dir.0);
    let mut train = flags(&dir.0, &dir.0.join("ckpt"), &dir.0.join("m.jsonl"));
    for attempt in 0..4 {
        train.push("--inject-fault".into());
        train.push(format!("kill:rank=0,step=1,attempt={attempt}"));
    }
    let out = launch(&["--nproc-per-node", "2", "--max-restarts", "2"], &train);
    let text = stderr(&out);
    assert!(
        !out.status.success() && !text.contains("panicked"),
        "{text}"
    );
    assert_eq!(
        text.matches("zero-train launch: attempt").count(),
        2,
        "{text}"
    );
    assert!(text.contains("restart 2 of 2 with 2 ranks"), "{text}");
    assert!(
        text.contains("attempt 2 (2 ranks) failed")
            && text.contains("the restart budget (--max-restarts 2) is spent"),
        "{text}"
    );
}

#[test]
fn a_rank_that_keeps_failing_shrinks_the_world_within_the_elastic_tolerance() {
    let dir = TempDir::new("launch-shrink");
    learnable_corpus(&dir.0);
    unbroken(&dir.0);
    let metrics = dir.0.join("shrunk.jsonl");
    let mut train = flags(&dir.0, &dir.0.join("ckpt"), &metrics);
    for attempt in 0..2 {
        train.push("--inject-fault".into());
        train.push(format!(
            "kill:rank=1,step={},attempt={attempt}",
            2 + attempt
        ));
    }
    let out = launch(
        &[
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "2",
            "--min-nproc",
            "1",
        ],
        &train,
    );
    let text = stderr(&out);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("restart 1 of 2 with 2 ranks"), "{text}");
    assert!(text.contains("restart 2 of 2 with 1 ranks"), "{text}");
    assert!(
        text.contains("finished with 1 ranks after 2 restart(s)"),
        "{text}"
    );
    // docs/checkpoints.md: at another world size the losses continue within 1e-5.
    let parse = |v: Vec<String>| -> Vec<f32> { v.iter().map(|s| s.parse().unwrap()).collect() };
    let want = parse(losses(&dir.0.join("unbroken.jsonl")));
    let got = parse(losses(&metrics));
    assert_eq!(got.len(), 3, "{text}");
    for (g, w) in got.iter().zip(&want[3..]) {
        assert!((g - w).abs() <= 1e-5, "{got:?} against {:?}", &want[3..]);
    }
}
