//! A save that fails mid-write (a full disk, emulated by a file-size limit: `ulimit -f`,
//! with SIGXFSZ ignored so the write fails with EFBIG instead of killing the process)
//! is a clear error naming the file, and leaves no `step-N.partial` folder behind to keep
//! the disk full; the same run without the limit publishes its state.

mod common;
use common::{command_line, learnable_corpus, TempDir};

use std::path::Path;
use std::process::{Command, Output};

fn flags(data: &Path, save: &Path) -> Vec<String> {
    let flags = [
        "--model",
        "tiny",
        "--seq-len",
        "16",
        "--steps",
        "2",
        "--batch-size",
        "4",
        "--micro-batch-size",
        "1",
        "--eval-every",
        "0",
        "--sample-tokens",
        "0",
        "--world-size",
        "2",
    ];
    command_line(&flags, &[("--data", data), ("--save", save)])
}

/// zero-train with `flags`, its files limited to `blocks` blocks of 512 bytes (POSIX sh).
fn limited(flags: &[String], blocks: u64) -> Output {
    let script = format!("trap '' XFSZ; ulimit -f {blocks} && exec \"$0\" \"$@\"");
    Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg(env!("CARGO_BIN_EXE_zero-train"))
        .args(flags)
        .output()
        .unwrap()
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[test]
fn a_save_that_fails_mid_write_is_an_error_and_removes_its_partial_folder() {
    let dir = TempDir::new("save-fails");
    learnable_corpus(&dir.0);
    // Each rank's piece file of the tiny model is about 180 KB; 64 blocks are 32 KB.
    let save = dir.0.join("ckpt");
    let out = limited(&flags(&dir.0, &save), 64);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && !stderr.contains("panicked"),
        "{stderr}"
    );
    assert!(
        stderr.contains("rank-0000") && stderr.contains(".bin"),
        "{stderr}"
    );
    assert!(stderr.to_lowercase().contains("file too large"), "{stderr}");
    let left = entries(&save);
    assert!(
        left.iter()
            .all(|n| !n.contains("partial") && !n.starts_with("step-")),
        "{left:?}"
    );

    // The control: the same run with room to write publishes step 2.
    let out = limited(&flags(&dir.0, &save), 1 << 20);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        entries(&save).contains(&"step-000002".to_string()),
        "{:?}",
        entries(&save)
    );
}
