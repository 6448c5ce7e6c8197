//! `zero-train --backend tcp`: one process per rank, started with torchrun's variables
//! (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`), trains to the same
//! losses, to the bit, as `--backend local` with as many rank threads; and a launch that goes
//! wrong ends in a clear error within `--comm-timeout`, never a hang or a panic.

mod common;
use common::{learnable_corpus, TempDir};

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

/// The tiny model over a few steps, no evaluation or sample, metrics to `metrics`.
fn args(data: &Path, metrics: &Path, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "--model",
        "tiny",
        "--seq-len",
        "16",
        "--steps",
        "3",
        "--batch-size",
        "4",
        "--micro-batch-size",
        "1",
        "--warmup-steps",
        "0",
        "--eval-every",
        "0",
        "--sample-tokens",
        "0",
        "--comm-timeout",
        "60",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(["--data".into(), data.display().to_string()]);
    args.extend(["--metrics".into(), metrics.display().to_string()]);
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// Replaces the value of `flag` in `args`.
fn set_flag(args: &mut [String], flag: &str, value: &str) {
    let at = args.iter().position(|a| a == flag).unwrap();
    args[at + 1] = value.to_string();
}

/// A port that was free a moment ago (bound to port 0, then released).
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// Starts rank `rank` of `world` with torchrun's variables.
fn spawn_rank(args: &[String], rank: usize, world: usize, port: u16) -> Child {
    Command::new(env!("CARGO_BIN_EXE_zero-train"))
        .args(args)
        .env("RANK", rank.to_string())
        .env("LOCAL_RANK", rank.to_string())
        .env("WORLD_SIZE", world.to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Ranks `0..world` of one tcp group on a fresh port, rank r with the flags `args_of(r)`;
/// their outputs once all have exited.
fn run_ranks(world: usize, args_of: impl Fn(usize) -> Vec<String>) -> Vec<Output> {
    let port = free_port();
    let ranks: Vec<Child> = (0..world)
        .map(|rank| spawn_rank(&args_of(rank), rank, world, port))
        .collect();
    ranks
        .into_iter()
        .map(|child| child.wait_with_output().unwrap())
        .collect()
}

/// The `"loss":…` fields of a metrics file, as written.
fn losses(metrics: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(metrics).unwrap_or_default();
    text.lines()
        .filter_map(|line| line.split("\"loss\":").nth(1))
        .map(|rest| rest.split([',', '}']).next().unwrap_or("").to_string())
        .collect()
}

fn check_ok(out: &Output, what: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{what} failed:\n{stderr}");
}

#[test]
fn two_tcp_processes_train_like_two_local_threads_at_every_stage() {
    let dir = TempDir::new("tcp-equal");
    learnable_corpus(&dir.0);
    for (stage, precision) in [("0", "fp32"), ("1", "bf16"), ("2", "fp32"), ("3", "bf16")] {
        let extra = ["--zero-stage", stage, "--precision", precision];
        let local_metrics = dir.0.join(format!("local-{stage}.jsonl"));
        let local = Command::new(env!("CARGO_BIN_EXE_zero-train"))
            .args(args(&dir.0, &local_metrics, &extra))
            .args(["--backend", "local", "--world-size", "2"])
            .output()
            .unwrap();
        check_ok(&local, "the local run");

        let outs = run_ranks(2, |rank| {
            let metrics = dir.0.join(format!("tcp-{stage}-{rank}.jsonl"));
            let mut a = args(&dir.0, &metrics, &extra);
            a.extend(["--backend", "tcp"].map(String::from));
            a
        });
        for (rank, out) in outs.iter().enumerate() {
            check_ok(out, &format!("tcp rank {rank}"));
        }
        let want = losses(&local_metrics);
        assert_eq!(want.len(), 3, "stage {stage}: {want:?}");
        // Rank 0 reports; its losses are the group's mean, as the local run's are.
        let got = losses(&dir.0.join(format!("tcp-{stage}-0.jsonl")));
        assert_eq!(
            got, want,
            "stage {stage} {precision}: tcp losses differ from local"
        );
    }
}

#[test]
fn four_tcp_processes_in_tensor_parallel_pairs_train_like_four_local_threads() {
    // --tensor-parallel-size 2: each process makes its groups from the launcher's world
    // (Communicator::split over tcp), and the group's sums cross processes.
    let dir = TempDir::new("tcp-tp");
    learnable_corpus(&dir.0);
    for (stage, precision) in [("0", "fp32"), ("3", "bf16")] {
        let extra = [
            "--zero-stage",
            stage,
            "--precision",
            precision,
            "--tensor-parallel-size",
            "2",
        ];
        let local_metrics = dir.0.join(format!("local-tp-{stage}.jsonl"));
        let local = Command::new(env!("CARGO_BIN_EXE_zero-train"))
            .args(args(&dir.0, &local_metrics, &extra))
            .args(["--backend", "local", "--world-size", "4"])
            .output()
            .unwrap();
        check_ok(&local, "the local run");
        let outs = run_ranks(4, |rank| {
            let metrics = dir.0.join(format!("tcp-tp-{stage}-{rank}.jsonl"));
            let mut a = args(&dir.0, &metrics, &extra);
            a.extend(["--backend", "tcp"].map(String::from));
            a
        });
        for (rank, out) in outs.iter().enumerate() {
            check_ok(out, &format!("tcp rank {rank}"));
        }
        let want = losses(&local_metrics);
        assert_eq!(want.len(), 3, "stage {stage}: {want:?}");
        let got = losses(&dir.0.join(format!("tcp-tp-{stage}-0.jsonl")));
        assert_eq!(got, want, "stage {stage} {precision}: tcp losses differ");
    }
}

#[test]
fn four_tcp_processes_at_t2_save_the_local_runs_pieces() {
    // Each process writes its own piece file; world rank 0 publishes once the data-parallel
    // and tensor-parallel groups agree that every rank wrote.
    let dir = TempDir::new("tcp-tp-save");
    learnable_corpus(&dir.0);
    let (local_save, tcp_save) = (dir.0.join("local-save"), dir.0.join("tcp-save"));
    let extra = |save: &Path| {
        let save = save.display().to_string();
        let flags = [
            "--zero-stage",
            "3",
            "--tensor-parallel-size",
            "2",
            "--save",
            &save,
        ];
        flags.map(String::from).to_vec()
    };
    let local_flags = extra(&local_save);
    let local_flags: Vec<&str> = local_flags.iter().map(String::as_str).collect();
    let local = Command::new(env!("CARGO_BIN_EXE_zero-train"))
        .args(args(&dir.0, &dir.0.join("local.jsonl"), &local_flags))
        .args(["--backend", "local", "--world-size", "4"])
        .output()
        .unwrap();
    check_ok(&local, "the local run");
    let tcp_flags = extra(&tcp_save);
    let tcp_flags: Vec<&str> = tcp_flags.iter().map(String::as_str).collect();
    let outs = run_ranks(4, |rank| {
        let metrics = dir.0.join(format!("tcp-save-{rank}.jsonl"));
        let mut a = args(&dir.0, &metrics, &tcp_flags);
        a.extend(["--backend", "tcp"].map(String::from));
        a
    });
    for (rank, out) in outs.iter().enumerate() {
        check_ok(out, &format!("tcp rank {rank}"));
    }
    for rank in 0..4 {
        let name = format!("step-000003/rank-{rank:05}.bin");
        let (a, b) = (
            std::fs::read(local_save.join(&name)),
            std::fs::read(tcp_save.join(&name)),
        );
        assert!(
            a.unwrap() == b.unwrap(),
            "{name} differs between tcp and local"
        );
    }
    assert!(tcp_save.join("step-000003/manifest.json").is_file());
}

#[test]
fn a_rank_that_never_comes_is_a_timeout_naming_the_launch() {
    let dir = TempDir::new("tcp-missing-rank");
    learnable_corpus(&dir.0);
    let metrics = dir.0.join("m.jsonl");
    let mut a = args(&dir.0, &metrics, &["--backend", "tcp"]);
    set_flag(&mut a, "--comm-timeout", "2");
    // Rank 0 of 2 alone: nobody joins it.
    let out = spawn_rank(&a, 0, 2, free_port())
        .wait_with_output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(stderr.contains("rank"), "{stderr}");
}

#[test]
fn a_bad_launch_variable_is_named() {
    let dir = TempDir::new("tcp-bad-env");
    learnable_corpus(&dir.0);
    let metrics = dir.0.join("m.jsonl");
    let a = args(&dir.0, &metrics, &["--backend", "tcp"]);
    let out = Command::new(env!("CARGO_BIN_EXE_zero-train"))
        .args(&a)
        .env("RANK", "2")
        .env("LOCAL_RANK", "0")
        .env("WORLD_SIZE", "2")
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", "29500")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && !stderr.contains("panicked"),
        "{stderr}"
    );
    assert!(stderr.contains("RANK"), "{stderr}");
    // A world past zero-train's 1024 ranks is refused before joining (after the join's
    // timeout the error would name the 4999 ranks that never came instead).
    let out = spawn_rank(&a, 0, 5000, free_port())
        .wait_with_output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("WORLD_SIZE 5000 is past the 1024"),
        "{stderr}"
    );
}

#[test]
fn a_comm_timeout_outside_its_range_is_named_before_joining() {
    let dir = TempDir::new("tcp-timeout-range");
    learnable_corpus(&dir.0);
    let metrics = dir.0.join("m.jsonl");
    for bad in ["0", "18446744073709551615"] {
        let mut a = args(&dir.0, &metrics, &["--backend", "tcp"]);
        set_flag(&mut a, "--comm-timeout", bad);
        // No peer and no launch variables: the refusal must come first.
        let out = Command::new(env!("CARGO_BIN_EXE_zero-train"))
            .args(&a)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && !stderr.contains("panicked"),
            "{stderr}"
        );
        assert!(
            stderr.contains("comm_timeout") || stderr.contains("comm-timeout"),
            "{stderr}"
        );
    }
}

#[test]
fn the_global_batch_divides_into_the_launchers_ranks_not_the_world_size_flag() {
    // Three ranks from the launcher, --world-size left at its default of 2: a batch of 3
    // divides into the ranks that run, which is what must be checked.
    let dir = TempDir::new("tcp-batch");
    learnable_corpus(&dir.0);
    let metrics = dir.0.join("m.jsonl");
    let mut a = args(&dir.0, &metrics, &["--backend", "tcp"]);
    set_flag(&mut a, "--batch-size", "3");
    for (rank, out) in run_ranks(3, |_| a.clone()).iter().enumerate() {
        check_ok(out, &format!("tcp rank {rank}"));
    }
    assert_eq!(losses(&metrics).len(), 3);
    // And a batch that does not divide into them is refused once they have joined.
    set_flag(&mut a, "--batch-size", "4");
    for out in run_ranks(3, |_| a.clone()) {
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains("world_size 3 = 3"),
            "{err}"
        );
    }
}
