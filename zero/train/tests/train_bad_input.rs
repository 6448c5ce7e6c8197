//! Bad input to the `zero-train` binary: each case, one that unchecked arithmetic or an
//! unchecked count would turn into a panic or a wrap, ends in a clear error that names the
//! flag (or the manifest field). The binary is spawned, so a panic shows in its stderr.

mod common;
use common::{offload_corpus, write_corpus, TempDir};

use std::path::{Path, PathBuf};
use std::process::Command;

fn corpus(dir: &Path) {
    let tokens: Vec<u16> = (0..4_000).map(|i| (i % 17) as u16).collect();
    write_corpus(dir, &tokens, 1_000, 100);
}

/// The tiny model, one rank, no evaluation or sample: a run of a few milliseconds.
fn tiny_args(data: &Path) -> Vec<String> {
    let data = data.to_str().unwrap();
    [
        "--model",
        "tiny",
        "--seq-len",
        "8",
        "--data",
        data,
        "--world-size",
        "1",
        "--batch-size",
        "1",
        "--micro-batch-size",
        "1",
        "--warmup-steps",
        "0",
        "--eval-every",
        "0",
        "--sample-tokens",
        "0",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Runs the binary; returns (success, stderr).
fn zero_train(args: &[String]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_zero-train"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Asserts a failed run whose message names `needle`, without a panic.
fn refused(args: &[String], needle: &str) {
    let (ok, stderr) = zero_train(args);
    assert!(!ok, "{args:?} succeeded:\n{stderr}");
    assert!(!stderr.contains("panicked"), "{args:?} panicked:\n{stderr}");
    assert!(
        stderr.contains(needle),
        "{args:?}: no {needle:?} in:\n{stderr}"
    );
}

/// `base` with the flag-value pairs of `extra` replacing or joining its own.
fn with(mut base: Vec<String>, extra: &[&str]) -> Vec<String> {
    for pair in extra.chunks(2) {
        match base.iter().position(|a| a == pair[0]) {
            Some(i) => base[i + 1] = pair[1].to_string(),
            None => base.extend(pair.iter().map(|s| s.to_string())),
        }
    }
    base
}

#[test]
fn an_overflowing_micro_batch_names_the_flag() {
    let dir = TempDir::new("micro");
    let max = u64::MAX.to_string();
    let args = with(
        tiny_args(&dir.0),
        &["--micro-batch-size", &max, "--world-size", "2"],
    );
    refused(&args, "--micro-batch-size");
}

#[test]
fn a_huge_world_size_names_the_flag_before_any_thread_starts() {
    let dir = TempDir::new("world");
    let huge = "1000000000000";
    let args = with(
        tiny_args(&dir.0),
        &["--world-size", huge, "--batch-size", huge],
    );
    refused(&args, "--world-size");
}

#[test]
fn a_huge_prefetch_names_the_flag() {
    let dir = TempDir::new("prefetch");
    corpus(&dir.0);
    let max = u64::MAX.to_string();
    let args = with(
        tiny_args(&dir.0),
        &["--zero-stage", "3", "--prefetch-units", &max],
    );
    refused(&args, "--prefetch-units");
}

#[test]
fn a_bad_stage_or_device_is_refused_when_parsed() {
    let dir = TempDir::new("enums");
    refused(
        &with(tiny_args(&dir.0), &["--zero-stage", "4"]),
        "--zero-stage",
    );
    refused(&with(tiny_args(&dir.0), &["--device", "tpu"]), "--device");
}

/// A negative or overflowing byte count is refused by the flag's name, with what a byte count
/// looks like, not taken for another flag.
#[test]
fn negative_or_overflowing_byte_counts_name_the_flag() {
    let dir = TempDir::new("bytes");
    for flag in ["--memory-limit", "--reduce-bucket-size"] {
        for value in ["-1", "99999999999999999999G", "17179869184T"] {
            let args = with(tiny_args(&dir.0), &[flag, value]);
            refused(&args, &format!("invalid value '{value}' for '{flag}"));
        }
    }
    let args: Vec<String> = [
        "export",
        "--from",
        "x",
        "--to",
        "y",
        "--max-shard-size",
        "-1",
    ]
    .map(String::from)
    .into();
    refused(&args, "invalid value '-1' for '--max-shard-size");
}

/// Saves after 2 steps; returns the state folder.
fn saved_state(dir: &Path) -> PathBuf {
    let save = dir.join("ckpt");
    let args = with(
        tiny_args(dir),
        &["--steps", "2", "--save", save.to_str().unwrap()],
    );
    let (ok, stderr) = zero_train(&args);
    assert!(ok, "{stderr}");
    save.join("step-000002")
}

#[test]
fn resuming_past_the_last_step_names_both_steps() {
    let dir = TempDir::new("past");
    corpus(&dir.0);
    let state = saved_state(&dir.0);
    let args = with(
        tiny_args(&dir.0),
        &["--steps", "1", "--resume", state.to_str().unwrap()],
    );
    refused(&args, "--steps");
}

/// Rewrites one field of the saved manifest (`path` of JSON object keys) to `value`.
fn edit_manifest(state: &Path, path: &[&str], value: serde_json::Value) {
    let file = state.join("manifest.json");
    let mut manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let mut at = &mut manifest;
    for key in path {
        at = &mut at[*key];
    }
    *at = value;
    std::fs::write(&file, manifest.to_string()).unwrap();
}

#[test]
fn a_hand_edited_manifest_is_refused() {
    let dir = TempDir::new("manifest");
    corpus(&dir.0);
    let state = saved_state(&dir.0);
    let resume = |steps: &str| {
        with(
            tiny_args(&dir.0),
            &["--steps", steps, "--resume", state.to_str().unwrap()],
        )
    };
    edit_manifest(&state, &["meta", "engine_steps"], u64::MAX.into());
    refused(&resume("4"), "engine_steps");
    edit_manifest(&state, &["meta", "engine_steps"], 2.into());
    // A step that is not the data loader's position, past --steps or not.
    for step in [u64::MAX, 3] {
        edit_manifest(&state, &["step"], step.into());
        refused(&resume("4"), "data loader stopped at batch 2");
    }
}

#[test]
fn a_checkpoint_segment_longer_than_the_model_and_an_absent_resume_folder_are_refused() {
    let dir = TempDir::new("segment");
    corpus(&dir.0);
    // The tiny preset has 2 layers.
    let args = with(tiny_args(&dir.0), &["--checkpoint-every", "3"]);
    refused(&args, "--checkpoint-every 3");
    refused(&args, "expected 1 to 2");
    let absent = dir.0.join("no-such-state");
    let args = with(tiny_args(&dir.0), &["--resume", absent.to_str().unwrap()]);
    refused(&args, "no such folder");
}

#[test]
fn a_shape_the_model_refuses_names_the_flags_that_made_it() {
    let dir = TempDir::new("shape-flags");
    corpus(&dir.0);
    // The tiny preset is 32 channels wide: 3 heads do not divide it.
    let args = with(tiny_args(&dir.0), &["--heads", "3"]);
    refused(&args, "--model tiny gives --layers 2 --heads 3 --dim 32");
    refused(&args, "must be a multiple of num_heads");
}

#[test]
fn a_resume_at_another_global_batch_names_the_batch_to_give() {
    let dir = TempDir::new("resume-batch");
    corpus(&dir.0);
    let state = saved_state(&dir.0);
    let args = with(
        tiny_args(&dir.0),
        &[
            "--steps",
            "3",
            "--batch-size",
            "2",
            "--resume",
            state.to_str().unwrap(),
        ],
    );
    refused(&args, "resume with --batch-size 1");
}

#[test]
fn val_bin_is_needed_only_by_a_run_that_evaluates() {
    let dir = TempDir::new("no-val");
    corpus(&dir.0);
    std::fs::remove_file(dir.0.join("val.bin")).unwrap();
    let (ok, stderr) = zero_train(&tiny_args(&dir.0));
    assert!(ok, "--eval-every 0 needed val.bin:\n{stderr}");
    refused(&with(tiny_args(&dir.0), &["--eval-every", "1"]), "val.bin");
}

#[test]
fn an_export_never_overwrites_and_refuses_what_it_would_ignore() {
    let dir = TempDir::new("export-refusals");
    corpus(&dir.0);
    let state = saved_state(&dir.0);
    let state = state.to_str().unwrap();
    let out = dir.0.join("model.safetensors");
    let out_s = out.to_str().unwrap();
    let export = |extra: &[&str]| -> Vec<String> {
        ["export", "--from", state, "--to", out_s]
            .iter()
            .chain(extra)
            .map(|s| s.to_string())
            .collect()
    };
    std::fs::write(&out, b"someone's model").unwrap();
    refused(&export(&[]), "exists: an export never overwrites");
    assert_eq!(std::fs::read(&out).unwrap(), b"someone's model");
    std::fs::remove_file(&out).unwrap();
    // Nor the config.json beside the file, another model's description.
    let config = dir.0.join("config.json");
    std::fs::write(&config, b"{}").unwrap();
    refused(&export(&[]), "config.json exists");
    assert_eq!(std::fs::read(&config).unwrap(), b"{}");
    std::fs::remove_file(&config).unwrap();
    let nested = dir.0.join("new").join("model.safetensors");
    let heads: Vec<String> = ["export", "--from", state, "--to"]
        .iter()
        .map(|s| s.to_string())
        .chain([
            nested.to_str().unwrap().into(),
            "--heads".into(),
            "2".into(),
        ])
        .collect();
    refused(&heads, "drop --heads");
    assert!(
        !dir.0.join("new").exists(),
        "a refused export made its folder"
    );
    let folder = dir.0.join("shards");
    let sharded = [
        "export",
        "--from",
        state,
        "--to",
        folder.to_str().unwrap(),
        "--max-shard-size",
        "0",
    ]
    .map(String::from);
    refused(&sharded, "--max-shard-size 0");
    assert!(!out.exists() && !folder.exists());
}

#[test]
fn a_manifest_whose_piece_file_leaves_the_state_folder_is_refused() {
    let dir = TempDir::new("manifest-escape");
    corpus(&dir.0);
    let state = saved_state(&dir.0);
    let args = with(
        tiny_args(&dir.0),
        &["--steps", "3", "--resume", state.to_str().unwrap()],
    );
    // The piece file moved out of the folder, the manifest pointing at it: every length and
    // checksum still matches, so only the name check stands between the reader and a file
    // outside the state.
    let moved = "../outside.bin";
    std::fs::rename(state.join("rank-00000.bin"), state.join(moved)).unwrap();
    let file = state.join("manifest.json");
    let mut manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    manifest["files"][0]["name"] = moved.into();
    for piece in manifest["pieces"].as_array_mut().unwrap() {
        if piece["file"] == "rank-00000.bin" {
            piece["file"] = moved.into();
        }
    }
    std::fs::write(&file, manifest.to_string()).unwrap();
    refused(&args, "is not a file name in the state folder");
}

#[test]
fn the_gpu_path_names_the_options_it_does_not_support() {
    let dir = TempDir::new("bad-input-gpu-options");
    corpus(&dir.0);
    let save = dir.0.join("ckpt");
    let mut args = tiny_args(&dir.0);
    args.extend(
        [
            "--device",
            "cuda",
            "--save",
            save.to_str().unwrap(),
            "--backend",
            "tcp",
        ]
        .map(String::from),
    );
    // Refused before any peer is waited for (no launch variables are set here).
    let (ok, stderr) = zero_train(&args);
    assert!(!ok && !stderr.contains("panicked"), "{stderr}");
    assert!(stderr.contains("--backend tcp"), "{stderr}");
    assert!(!save.exists(), "a refused run wrote its checkpoint folder");
}

/// On the GPU both file tiers pass the checks (each streams through a host arena): on this
/// GPU-less machine the run stops at the build or the CUDA library, naming it, before any
/// file is made.
#[test]
fn on_the_gpu_both_file_tiers_pass_the_checks() {
    let dir = TempDir::new("bad-input-gpu-nvme");
    offload_corpus(&dir.0, 3);
    let nvme = dir.0.join("nvme");
    let nvme = nvme.to_str().unwrap();
    let gpu = with(
        tiny_args(&dir.0),
        &["--device", "cuda", "--zero-stage", "3", "--nvme-path", nvme],
    );
    let tiers: [&[&str]; 2] = [
        &["--offload-optimizer", "cpu", "--offload-params", "nvme"],
        &["--offload-optimizer", "nvme"],
    ];
    for tier in tiers {
        let (ok, stderr) = zero_train(&with(gpu.clone(), tier));
        assert!(!ok && !stderr.contains("panicked"), "{tier:?}: {stderr}");
        assert!(!stderr.contains("CPU only"), "{tier:?}: {stderr}");
        let named = stderr.contains("--features cuda") || stderr.contains("libcuda");
        assert!(named, "{tier:?}: {stderr}");
        let made = std::fs::read_dir(nvme).unwrap().count();
        assert_eq!(
            made, 0,
            "{tier:?}: a run stopped before its start made a file"
        );
    }
}

#[test]
fn the_gpu_path_without_the_cuda_build_or_a_gpu_says_which() {
    let dir = TempDir::new("bad-input-gpu");
    corpus(&dir.0);
    let mut args = tiny_args(&dir.0);
    args.extend(["--device", "cuda"].map(String::from));
    let (ok, stderr) = zero_train(&args);
    assert!(!ok && !stderr.contains("panicked"), "{stderr}");
    // Without the feature the build is named; with it, on this GPU-less machine, the
    // missing CUDA library is.
    let named = stderr.contains("--features cuda") || stderr.contains("libcuda");
    assert!(named, "{stderr}");
}

/// `--backend nccl --device cuda` on the tiny run, with `env` set; returns (success, stderr).
fn nccl_run(dir: &Path, env: &[(&str, &str)]) -> (bool, String) {
    let mut args = tiny_args(dir);
    args.extend(
        [
            "--backend",
            "nccl",
            "--device",
            "cuda",
            "--comm-timeout",
            "5",
        ]
        .map(String::from),
    );
    let out = Command::new(env!("CARGO_BIN_EXE_zero-train"))
        .args(&args)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn nccl_on_the_cpu_names_the_device_flag() {
    let dir = TempDir::new("bad-input-nccl-cpu");
    corpus(&dir.0);
    let args = with(tiny_args(&dir.0), &["--backend", "nccl", "--device", "cpu"]);
    refused(&args, "--device cuda");
}

#[test]
fn nccl_without_a_launcher_names_the_feature_or_the_library_it_lacks() {
    let dir = TempDir::new("bad-input-nccl-build");
    corpus(&dir.0);
    let (ok, stderr) = nccl_run(&dir.0, &[]);
    assert!(!ok && !stderr.contains("panicked"), "{stderr}");
    // Without `cuda` the build flag is named; with it, on this GPU-less machine, the missing
    // CUDA driver (checked before any launcher is looked for).
    let needle = if cfg!(feature = "cuda") {
        "libcuda"
    } else {
        "--features cuda"
    };
    assert!(stderr.contains(needle), "no {needle:?} in:\n{stderr}");
}

#[test]
fn nccl_under_a_torchrun_style_launch_checks_the_gpu_before_waiting_for_peers() {
    let dir = TempDir::new("bad-input-nccl-torchrun");
    corpus(&dir.0);
    // Rank 0 of 2 with nobody else: the GPU check must fail before it waits for rank 1.
    let torchrun = [
        ("RANK", "0"),
        ("LOCAL_RANK", "0"),
        ("WORLD_SIZE", "2"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "29517"),
    ];
    let (ok, stderr) = nccl_run(&dir.0, &torchrun);
    assert!(!ok && !stderr.contains("panicked"), "{stderr}");
    let needle = if cfg!(feature = "cuda") {
        "libcuda"
    } else {
        "--features cuda"
    };
    assert!(stderr.contains(needle), "no {needle:?} in:\n{stderr}");
}

#[test]
fn a_model_larger_than_the_machine_is_refused_at_start_up_not_killed_mid_run() {
    if !Path::new("/proc/meminfo").exists() {
        println!("skipped: no /proc/meminfo, so the host check cannot run here");
        return;
    }
    // 12 C^2 weights per layer at C = 2^20: hundreds of TiB, more than any CI machine.
    let dir = TempDir::new("host_memory");
    corpus(&dir.0);
    let args = with(tiny_args(&dir.0), &["--dim", "1048576", "--steps", "1"]);
    refused(&args, "MemAvailable");
    refused(&args, "--memory-limit");
}

#[test]
fn zero_host_memory_replaces_memavailable_and_a_value_that_is_no_byte_count_is_refused() {
    let dir = TempDir::new("host_memory_override");
    corpus(&dir.0);
    let args = with(tiny_args(&dir.0), &["--steps", "1"]);
    let run = |value: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_zero-train"))
            .args(&args)
            .env("ZERO_HOST_MEMORY", value)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!stderr.contains("panicked"), "{value}: {stderr}");
        (out.status.success(), stderr)
    };
    let (ok, stderr) = run("lots");
    assert!(
        !ok && stderr.contains("ZERO_HOST_MEMORY: invalid byte count \"lots\""),
        "{stderr}"
    );
    // The tiny model fits any machine, but not the 1 KiB this run is told it has.
    let (ok, stderr) = run("1K");
    assert!(!ok && stderr.contains("ZERO_HOST_MEMORY"), "{stderr}");
    let (ok, stderr) = run("64G");
    assert!(ok, "{stderr}");
    // Empty is unset, as shells write it: MemAvailable is read.
    let (ok, stderr) = run("");
    assert!(ok, "{stderr}");
}
