//! `--inject-fault`: each fault kind on the local backend (ranks as threads) and on TCP (one
//! process per rank) ends with an error that names the rank, the op and its sequence number
//! within the deadline (`--comm-timeout` plus a margin, asserted with a generous bound that
//! only proves "no hang"), or, for `slow`, is survived with the unbroken run's losses.

mod common;
use common::{command_line, learnable_corpus, stderr, TempDir};

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Seconds a rank waits for its peers in these runs (to join, too: ranks started at once on
/// a loaded 2-core machine must not time out before any fault).
const TIMEOUT_S: u64 = 10;
/// A bound that only a hang would pass: the timeout, a hung rank's 2 x timeout, and room
/// for a loaded 2-core machine.
const NO_HANG: Duration = Duration::from_secs(3 * TIMEOUT_S + 60);

fn args(data: &Path, metrics: &Path, extra: &[&str]) -> Vec<String> {
    let flags = [
        "--model",
        "tiny",
        "--seq-len",
        "16",
        "--steps",
        "3",
        "--batch-size",
        "6",
        "--micro-batch-size",
        "1",
        "--warmup-steps",
        "0",
        "--eval-every",
        "0",
        "--sample-tokens",
        "0",
        "--comm-timeout",
        &TIMEOUT_S.to_string(),
    ];
    let mut args = command_line(&flags, &[("--data", data), ("--metrics", metrics)]);
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// A `--backend local` run of `world` rank threads; its output and how long it took.
fn local(dir: &Path, world: usize, extra: &[&str]) -> (Output, Duration) {
    let began = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_zero-train"))
        .args(args(dir, &dir.join("local.jsonl"), extra))
        .args(["--backend", "local", "--world-size", &world.to_string()])
        .output()
        .unwrap();
    (out, began.elapsed())
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// `world` TCP rank processes; their outputs and how long until all had exited.
fn tcp(dir: &Path, world: usize, extra: &[&str]) -> (Vec<Output>, Duration) {
    let port = free_port();
    let began = Instant::now();
    let ranks: Vec<Child> = (0..world)
        .map(|rank| {
            let metrics = dir.join(format!("tcp-{rank}.jsonl"));
            Command::new(env!("CARGO_BIN_EXE_zero-train"))
                .args(args(dir, &metrics, extra))
                .args(["--backend", "tcp"])
                .env("RANK", rank.to_string())
                .env("LOCAL_RANK", rank.to_string())
                .env("WORLD_SIZE", world.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outs = ranks
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    (outs, began.elapsed())
}

/// A failed run, no panic, its stderr holding every one of `needles`; within [`NO_HANG`].
fn fails_naming(out: &Output, took: Duration, needles: &[&str]) {
    let text = stderr(out);
    assert!(!out.status.success(), "it succeeded:\n{text}");
    assert!(!text.contains("panicked"), "{text}");
    for needle in needles {
        assert!(text.contains(needle), "no {needle:?} in:\n{text}");
    }
    assert!(took < NO_HANG, "took {took:?}:\n{text}");
}

/// The `"loss":…` and `"step_ms":…` fields of a metrics file.
fn field(metrics: &Path, name: &str) -> Vec<String> {
    let text = std::fs::read_to_string(metrics).unwrap_or_default();
    let key = format!("\"{name}\":");
    text.lines()
        .filter_map(|line| line.split(key.as_str()).nth(1))
        .map(|rest| rest.split([',', '}']).next().unwrap_or("").to_string())
        .collect()
}

#[test]
fn a_killed_rank_is_named_by_its_survivors_local() {
    let dir = TempDir::new("fault-kill-local");
    learnable_corpus(&dir.0);
    let (out, took) = local(&dir.0, 3, &["--inject-fault", "kill:rank=1,step=1"]);
    // The killed thread's own line, and both survivors naming it at their op and number.
    fails_naming(
        &out,
        took,
        &[
            "injecting fault kill:rank=1,step=1,attempt=0",
            "injected fault kill on rank 1 at",
            "rank 0: ",
            "rank 2: ",
            "rank 1 dropped its communicator",
        ],
    );
    let text = stderr(&out);
    let survivor = text.lines().find(|l| l.contains("rank 0: ")).unwrap();
    assert!(
        survivor.contains(" #") && survivor.contains("failed on rank 0"),
        "{survivor}"
    );
}

#[test]
fn a_killed_rank_process_exits_137_and_its_peer_names_it_tcp() {
    let dir = TempDir::new("fault-kill-tcp");
    learnable_corpus(&dir.0);
    let (outs, took) = tcp(&dir.0, 2, &["--inject-fault", "kill:rank=1,step=1"]);
    assert_eq!(outs[1].status.code(), Some(137), "{}", stderr(&outs[1]));
    assert!(stderr(&outs[1]).contains("injected fault kill on rank 1 at"));
    fails_naming(&outs[0], took, &["failed on rank 0", "rank 1", " #"]);
}

#[test]
fn a_hung_rank_is_a_timeout_naming_it_local() {
    let dir = TempDir::new("fault-hang-local");
    learnable_corpus(&dir.0);
    let (out, took) = local(&dir.0, 2, &["--inject-fault", "hang:rank=1,step=1"]);
    fails_naming(
        &out,
        took,
        &["rank 0: ", "timed out after", "ranks [1] did not arrive"],
    );
}

#[test]
fn a_hung_rank_is_a_timeout_naming_it_tcp() {
    let dir = TempDir::new("fault-hang-tcp");
    learnable_corpus(&dir.0);
    let began = Instant::now();
    let (outs, took) = tcp(&dir.0, 2, &["--inject-fault", "hang:rank=1,step=1"]);
    fails_naming(&outs[0], took, &["timed out after", "[1]", " #"]);
    fails_naming(&outs[1], took, &["injected fault hang on rank 1 at"]);
    // The survivor cannot have failed before its timeout ran out.
    assert!(began.elapsed() >= Duration::from_secs(TIMEOUT_S));
}

/// A slowed rank changes nothing but the time: the losses are the unbroken run's, and the
/// steps it slowed took at least its pause.
fn slow_is_survived(dir: &Path, metrics: &Path, run: impl Fn(&[&str]) -> bool) {
    assert!(run(&[]), "the unbroken run failed");
    let want = field(metrics, "loss");
    assert!(
        run(&["--inject-fault", "slow=40:rank=1,step=1"]),
        "the slowed run failed"
    );
    assert_eq!(field(metrics, "loss"), want, "in {}", dir.display());
    let ms: Vec<f64> = field(metrics, "step_ms")
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
    assert_eq!(ms.len(), 3);
    assert!(ms[1] >= 40.0 && ms[2] >= 40.0, "step_ms {ms:?}");
}

#[test]
fn a_slow_rank_is_survived_with_the_same_losses_local() {
    let dir = TempDir::new("fault-slow-local");
    learnable_corpus(&dir.0);
    let metrics = dir.0.join("local.jsonl");
    slow_is_survived(&dir.0, &metrics, |extra| {
        local(&dir.0, 2, extra).0.status.success()
    });
}

#[test]
fn a_slow_rank_is_survived_with_the_same_losses_tcp() {
    let dir = TempDir::new("fault-slow-tcp");
    learnable_corpus(&dir.0);
    let metrics = dir.0.join("tcp-0.jsonl");
    slow_is_survived(&dir.0, &metrics, |extra| {
        tcp(&dir.0, 2, extra).0.iter().all(|o| o.status.success())
    });
}

#[test]
fn a_corrupt_result_is_named_by_payload_checksums_local_and_tcp() {
    let dir = TempDir::new("fault-corrupt-checksums");
    learnable_corpus(&dir.0);
    let flags = [
        "--comm-checksums",
        "--inject-fault",
        "corrupt:rank=1,step=1,op=all_gather",
    ];
    let needles = [
        "all_gather #",
        "payload checksums differ",
        "ranks [1] hold a result",
    ];
    let (out, took) = local(&dir.0, 3, &flags);
    fails_naming(&out, took, &needles);
    let (outs, took) = tcp(&dir.0, 3, &flags);
    for out in &outs {
        fails_naming(out, took, &needles);
    }
}

#[test]
fn a_corrupt_result_without_checksums_is_named_by_the_fingerprint_local_and_tcp() {
    let dir = TempDir::new("fault-corrupt-fingerprint");
    learnable_corpus(&dir.0);
    // Stage 0 all-reduces whole gradients and every rank updates every parameter, so a
    // gradient corrupted on rank 2 makes its parameters differ from its peers'.
    let flags = [
        "--fingerprint-every",
        "1",
        "--zero-stage",
        "0",
        "--inject-fault",
        "corrupt:rank=2,step=1,op=all_reduce",
    ];
    let needles = [
        "parameter fingerprint after step 2",
        "ranks [2] hold parameters",
    ];
    let (out, took) = local(&dir.0, 3, &flags);
    fails_naming(&out, took, &needles);
    let (outs, took) = tcp(&dir.0, 3, &flags);
    for out in &outs {
        fails_naming(out, took, &needles);
    }
    // The same run with the fingerprint but no fault finishes: the check itself is sound.
    let (out, _) = local(&dir.0, 3, &flags[..4]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn a_diverged_unit_order_is_named_by_the_program_check_local_and_tcp() {
    let dir = TempDir::new("fault-diverge");
    learnable_corpus(&dir.0);
    let flags = ["--inject-fault", "diverge:rank=1,step=1"];
    let needles = ["rank 1 ran a program it did not declare"];
    let (out, took) = local(&dir.0, 2, &flags);
    fails_naming(&out, took, &needles);
    let (outs, took) = tcp(&dir.0, 2, &flags);
    fails_naming(&outs[1], took, &needles);
    fails_naming(&outs[0], took, &["rank 1", " #"]);
}

#[test]
fn faults_and_fingerprints_that_cannot_work_are_refused_naming_the_flag() {
    let dir = TempDir::new("fault-bad-spec");
    learnable_corpus(&dir.0);
    for (spec, needle) in [
        (
            "kill:rank=2,step=1",
            "invalid --inject-fault kill:rank=2,step=1",
        ),
        ("kill:rank=0,step=3", "step below --steps 3"),
        (
            "kill:rank=0,step=18446744073709551616",
            "step=18446744073709551616 is past",
        ),
    ] {
        let (out, took) = local(&dir.0, 2, &["--inject-fault", spec]);
        fails_naming(&out, took, &[needle]);
    }
}

#[test]
fn zero_inject_fault_adds_faults_and_a_bad_one_is_named() {
    let dir = TempDir::new("fault-env");
    learnable_corpus(&dir.0);
    let run = |value: &str| {
        let began = Instant::now();
        let out = Command::new(env!("CARGO_BIN_EXE_zero-train"))
            .args(args(&dir.0, &dir.0.join("env.jsonl"), &[]))
            .args(["--backend", "local", "--world-size", "2"])
            .env("ZERO_INJECT_FAULT", value)
            .output()
            .unwrap();
        (out, began.elapsed())
    };
    let (out, took) = run("slow=1:rank=0,step=0; kill:rank=1,step=2");
    fails_naming(
        &out,
        took,
        &[
            "injecting fault slow=1:rank=0",
            "injected fault kill on rank 1 at",
        ],
    );
    let (out, took) = run("kill:rank=1");
    fails_naming(
        &out,
        took,
        &["ZERO_INJECT_FAULT \"kill:rank=1\": step=S is required"],
    );
}
