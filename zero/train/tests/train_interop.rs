//! Model files from other tools in and out of `zero-train`, through the binary as a user runs
//! it: `--init-from` takes the shape from the file (llm.c or safetensors), a contradicting
//! shape flag is refused by name, and `export` writes the same parameters whichever source
//! (training state or model file) it starts from.

mod common;
use common::{write_corpus, TempDir};

use std::path::Path;
use std::process::{Command, Output};

fn corpus(dir: &Path) {
    let tokens: Vec<u16> = (0..4_000).map(|i| ((i * 7) % 23) as u16).collect();
    write_corpus(dir, &tokens, 1_000, 100);
}

fn zero_train(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_zero-train"))
        .args(args)
        .output()
        .unwrap()
}

fn ok(out: Output) -> Output {
    assert!(
        out.status.success(),
        "zero-train failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A run of 3 steps of a 2-layer model with 3 heads (not the tiny preset's shape).
const RUN: &[&str] = &[
    "--seq-len",
    "8",
    "--world-size",
    "2",
    "--batch-size",
    "2",
    "--micro-batch-size",
    "1",
    "--warmup-steps",
    "0",
    "--eval-every",
    "0",
    "--sample-tokens",
    "0",
    "--steps",
    "3",
];

/// The `"loss":` values of a metrics file, in order.
fn losses(metrics: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(metrics).unwrap();
    text.lines()
        .filter_map(|l| l.split("\"loss\":").nth(1))
        .map(|rest| rest.split([',', '}']).next().unwrap().to_string())
        .collect()
}

#[test]
fn model_files_bring_their_shape_and_exports_agree() {
    let tmp = TempDir::new("shape");
    let p = |name: &str| tmp.0.join(name).to_str().unwrap().to_string();
    corpus(&tmp.0);
    let shape = [
        "--model", "tiny", "--layers", "2", "--heads", "3", "--dim", "48",
    ];
    let data = p("");
    let mut first: Vec<&str> = [&["--data", &data][..], RUN, &shape].concat();
    let save = p("ck");
    first.extend(["--save", &save]);
    ok(zero_train(&first));

    let st = p("a/model.safetensors");
    let bin = p("b/model.bin");
    let st_from_bin = p("c/model.safetensors");
    ok(zero_train(&["export", "--from", &save, "--to", &st]));
    ok(zero_train(&[
        "export", "--from", &save, "--to", &bin, "--format", "llmc",
    ]));
    ok(zero_train(&[
        "export",
        "--from",
        &bin,
        "--to",
        &st_from_bin,
    ]));
    // Two routes to one file: state -> safetensors, and state -> llm.c -> safetensors.
    assert_eq!(
        std::fs::read(&st).unwrap(),
        std::fs::read(&st_from_bin).unwrap()
    );
    let config = std::fs::read_to_string(tmp.0.join("a/config.json")).unwrap();
    assert!(
        config.contains("\"n_head\": 3") || config.contains("\"n_head\":3"),
        "{config}"
    );

    // Started from either file with no shape flag, the runs see the 3-head model: the
    // same losses, from two readers of two formats.
    let run_from = |file: &str, metrics: &str| {
        let args: Vec<&str> = [
            &["--data", &data, "--init-from", file, "--metrics", metrics][..],
            RUN,
        ]
        .concat();
        ok(zero_train(&args));
        losses(Path::new(metrics))
    };
    let from_st = run_from(&st, &p("st.jsonl"));
    let from_bin = run_from(&bin, &p("bin.jsonl"));
    assert_eq!(from_st.len(), 3);
    assert_eq!(from_st, from_bin);
    // And the weights were used: a fresh start of the same shape gives other losses.
    let scratch = p("scratch.jsonl");
    let args: Vec<&str> = [&["--data", &data, "--metrics", &scratch][..], RUN, &shape].concat();
    ok(zero_train(&args));
    assert_ne!(losses(Path::new(&scratch)), from_st);
}

#[test]
fn a_shape_flag_that_contradicts_the_file_is_refused_by_name() {
    let tmp = TempDir::new("conflict");
    let p = |name: &str| tmp.0.join(name).to_str().unwrap().to_string();
    corpus(&tmp.0);
    let data = p("");
    let mut args: Vec<&str> = [&["--data", &data, "--model", "tiny"][..], RUN].concat();
    let bin = p("init.bin");
    args.extend(["--export-llmc", &bin]);
    ok(zero_train(&args));
    let out = zero_train(&[
        "--data",
        &p(""),
        "--init-from",
        &bin,
        "--layers",
        "7",
        "--steps",
        "1",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--layers 7") && err.contains("num_layers"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn a_missing_or_foreign_init_file_is_a_clear_error() {
    let tmp = TempDir::new("foreign");
    let p = |name: &str| tmp.0.join(name).to_str().unwrap().to_string();
    corpus(&tmp.0);
    std::fs::write(p("junk.bin"), b"not a model at all").unwrap();
    for (file, expect) in [(p("absent.bin"), "absent.bin"), (p("junk.bin"), "junk.bin")] {
        let out = zero_train(&["--data", &p(""), "--init-from", &file, "--steps", "1"]);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--init-from") && err.contains(expect), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

/// A corpus in `tmp` and an llm.c file of the tiny preset trained on it by `RUN`: (data
/// folder, model file).
fn corpus_and_tiny_model_file(tmp: &TempDir) -> (String, String) {
    let p = |name: &str| tmp.0.join(name).to_str().unwrap().to_string();
    corpus(&tmp.0);
    let (data, bin) = (p(""), p("tiny.bin"));
    let mut args: Vec<&str> = [&["--data", &data, "--model", "tiny"][..], RUN].concat();
    args.extend(["--export-llmc", &bin]);
    ok(zero_train(&args));
    (data, bin)
}

#[test]
fn a_short_context_file_sets_the_default_seq_len_and_a_preset_must_be_its_shape() {
    let tmp = TempDir::new("context");
    // The tiny preset's context is 32 tokens, under the default --seq-len of 64.
    let (data, bin) = corpus_and_tiny_model_file(&tmp);
    let one_step = [
        "--data",
        &data,
        "--init-from",
        &bin,
        "--steps",
        "1",
        "--world-size",
        "1",
        "--batch-size",
        "1",
        "--micro-batch-size",
        "1",
        "--eval-every",
        "0",
        "--sample-tokens",
        "0",
    ];
    let run = |extra: &[&str]| zero_train(&[&one_step[..], extra].concat());
    let out = ok(run(&[]));
    let said = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("global batch 1 x 32 tokens"), "{said}");
    // A --seq-len typed past the file's context is still refused by name.
    let err = String::from_utf8_lossy(&run(&["--seq-len", "64"]).stderr).to_string();
    assert!(
        err.contains("--seq-len 64") && err.contains("at most 32"),
        "{err}"
    );
    // --model must name the file's shape, overrides included.
    let err = String::from_utf8_lossy(&run(&["--model", "gpt2"]).stderr).to_string();
    assert!(err.contains("--model gpt2 contradicts"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    ok(run(&["--model", "tiny"]));
}

#[test]
fn a_resume_takes_the_states_weights_over_the_init_file() {
    let tmp = TempDir::new("init-resume");
    let p = |name: &str| tmp.0.join(name).to_str().unwrap().to_string();
    let (data, bin) = corpus_and_tiny_model_file(&tmp);
    // Two steps from the file, saved; then step 3 resumed with and without --init-from.
    let save = p("ck");
    let base: Vec<&str> = [&["--data", &data, "--init-from", &bin][..], RUN].concat();
    let mut two_steps = base.clone();
    let steps = two_steps.iter().position(|a| *a == "--steps").unwrap();
    two_steps[steps + 1] = "2";
    ok(zero_train(&[&two_steps[..], &["--save", &save]].concat()));
    let (with, without) = (p("with.jsonl"), p("without.jsonl"));
    let out = ok(zero_train(
        &[&base[..], &["--resume", &save, "--metrics", &with]].concat(),
    ));
    let said = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("its weights, not"), "{said}");
    let plain: Vec<&str> = [&["--data", &data, "--model", "tiny"][..], RUN].concat();
    ok(zero_train(
        &[&plain[..], &["--resume", &save, "--metrics", &without]].concat(),
    ));
    let (a, b) = (losses(Path::new(&with)), losses(Path::new(&without)));
    assert_eq!(a.len(), 1);
    assert_eq!(a, b);
}
