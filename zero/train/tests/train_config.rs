//! The configuration: flags over the `--config` file over defaults, DeepSpeed aliases,
//! unknown keys refused, and every value range-checked without a panic.

use clap::Parser;
use proptest::prelude::*;
use std::path::{Path, PathBuf};
use zero::ZeroStage;
use zero_train::cli::config::Device;
use zero_train::cli::validate::{MAX_BATCH_TOKENS, MAX_RANKS};
use zero_train::{ByteSize, ConfigError, OffloadTier, TrainArgs, TrainConfig};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: TrainArgs,
}

fn parse(flags: &[&str]) -> Result<TrainArgs, clap::Error> {
    Cli::try_parse_from(std::iter::once("zero-train").chain(flags.iter().copied())).map(|c| c.args)
}

fn resolve(flags: &[&str]) -> Result<TrainConfig, ConfigError> {
    parse(flags).unwrap().resolve().map(|(cfg, _)| cfg)
}

/// A TOML file in its own temporary directory, removed on drop.
struct TomlFile(PathBuf);

impl TomlFile {
    fn new(tag: &str, text: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("zero-config-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("run.toml"), text).unwrap();
        Self(dir)
    }

    fn path(&self) -> PathBuf {
        self.0.join("run.toml")
    }
}

impl Drop for TomlFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn no_flags_give_the_readme_defaults() {
    let cfg = resolve(&[]).unwrap();
    assert_eq!(cfg, TrainConfig::default());
    // The README's main job, written out independently of the clap attributes.
    assert_eq!(cfg.model, "small");
    assert_eq!((cfg.seq_len, cfg.world_size, cfg.steps), (64, 2, 200));
    assert_eq!((cfg.batch_size, cfg.micro_batch_size), (8, 4));
    assert_eq!(
        (cfg.lr, cfg.warmup_steps, cfg.min_lr_ratio),
        (1e-3, 20, 0.1)
    );
    assert_eq!(cfg.zero_stage, ZeroStage::Zero2);
    assert_eq!(cfg.reduce_bucket_size, ByteSize(4 << 20));
    assert_eq!(cfg.data, Path::new("data/shakespeare"));
}

#[test]
fn flags_override_the_file_which_overrides_defaults() {
    let file = TomlFile::new(
        "layers",
        "steps = 7\nlr = 0.01\nstage = 3\nreduce_bucket_size = \"2M\"\nseq_len = 32\n",
    );
    let p = file.path();
    // --seq-len typed at its default value still wins over the file.
    let cfg = resolve(&[
        "--config",
        p.to_str().unwrap(),
        "--lr",
        "0.5",
        "--seq-len",
        "64",
    ])
    .unwrap();
    assert_eq!(cfg.steps, 7);
    assert_eq!(cfg.lr, 0.5);
    assert_eq!(cfg.seq_len, 64);
    assert_eq!(cfg.zero_stage, ZeroStage::Zero3);
    assert_eq!(cfg.reduce_bucket_size, ByteSize(2 << 20));
    assert_eq!(cfg.seed, 1337);
}

#[test]
fn deepspeed_names_are_accepted_in_the_file() {
    let file = TomlFile::new(
        "aliases",
        "train_batch_size = 16\ntrain_micro_batch_size_per_gpu = 2\ngradient_clipping = 0.5\nprefetch = 2\n",
    );
    let cfg = resolve(&["--config", file.path().to_str().unwrap()]).unwrap();
    assert_eq!((cfg.batch_size, cfg.micro_batch_size), (16, 2));
    assert_eq!((cfg.grad_clip, cfg.prefetch_units), (0.5, 2));
}

#[test]
fn memory_limit_accepts_suffixes_on_the_command_line() {
    let cfg = resolve(&["--memory-limit", "16G"]).unwrap();
    assert_eq!(cfg.memory_limit, Some(ByteSize(16 << 30)));
}

#[test]
fn a_misspelled_key_names_itself() {
    let file = TomlFile::new("typo", "stpes = 7\n");
    let err = resolve(&["--config", file.path().to_str().unwrap()]).unwrap_err();
    assert!(matches!(err, ConfigError::Parse { .. }));
    assert!(err.to_string().contains("stpes"), "{err}");
    // A flag's spelling on the third line: the line, the key and the key meant, on one line.
    let file = TomlFile::new("dashes", "steps = 2\n\nzero-stage = 3\n");
    let err = resolve(&["--config", file.path().to_str().unwrap()])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("line 3: unknown key `zero-stage` (did you mean `zero_stage`?)"),
        "{err}"
    );
    assert!(!err.contains('\n'), "{err}");
}

#[test]
fn a_nan_in_the_file_names_its_key() {
    let file = TomlFile::new("nan", "lr = nan\n");
    let err = resolve(&["--config", file.path().to_str().unwrap()]).unwrap_err();
    assert!(err.to_string().contains("--lr"), "{err}");
}

#[test]
fn a_bad_stage_in_the_file_is_refused() {
    let file = TomlFile::new("stage", "zero_stage = 4\n");
    let err = resolve(&["--config", file.path().to_str().unwrap()]).unwrap_err();
    assert!(err.to_string().contains("zero_stage 4"), "{err}");
}

#[test]
fn a_missing_file_is_named() {
    let err = resolve(&["--config", "/nonexistent/run.toml"]).unwrap_err();
    assert!(err.to_string().contains("/nonexistent/run.toml"), "{err}");
}

#[test]
fn an_uneven_batch_is_refused_with_the_arithmetic() {
    let err = resolve(&[
        "--batch-size",
        "10",
        "--micro-batch-size",
        "4",
        "--world-size",
        "2",
    ])
    .unwrap_err();
    assert!(err.to_string().contains("4 x world_size 2 = 8"), "{err}");
    assert!(err.to_string().contains("--batch-size"), "{err}");
}

#[test]
fn devices_name_a_gpu_by_ordinal_in_flags_and_files() {
    let flag = |v: &str| resolve(&["--device", v]).map(|c| c.device);
    assert_eq!(flag("cpu").unwrap(), Device::Cpu);
    assert_eq!(flag("cuda").unwrap(), Device::Cuda(None));
    assert_eq!(flag("cuda:3").unwrap(), Device::Cuda(Some(3)));
    let file = TomlFile::new("device-ordinal", "device = \"cuda:1\"\n");
    let from_file = resolve(&["--config", file.path().to_str().unwrap()]).unwrap();
    assert_eq!(from_file.device, Device::Cuda(Some(1)));
    for bad in [
        "cuda:",
        "cuda:-1",
        "cuda:+1",
        "cuda:1x",
        "gpu:0",
        "cuda:65536",
        "cuda:99999999999999999999",
    ] {
        let err = parse(&["--device", bad]).err().unwrap().to_string();
        assert!(err.contains("--device"), "{bad}: {err}");
    }
}

#[test]
fn bad_enums_are_refused_by_the_parser() {
    for flag in ["--zero-stage=4", "--zero-stage=-1", "--device=tpu"] {
        let err = parse(&[flag]).err().unwrap();
        let flag = flag.split('=').next().unwrap();
        assert!(err.to_string().contains(flag), "{err}");
    }
}

#[test]
fn each_out_of_range_value_names_its_flag() {
    let max = u64::MAX.to_string();
    let cases: &[(&[&str], &str)] = &[
        (&["--world-size", "0"], "--world-size"),
        (
            &[
                "--world-size",
                "4096",
                "--batch-size",
                "4096",
                "--micro-batch-size",
                "1",
            ],
            "--world-size",
        ),
        (&["--micro-batch-size", &max], "--micro-batch-size"),
        (&["--batch-size", "0"], "--batch-size"),
        (&["--seq-len", "0"], "--seq-len"),
        (&["--steps", &max], "--steps"),
        (&["--lr", "NaN"], "--lr"),
        (&["--lr=-1"], "--lr"),
        (&["--min-lr-ratio", "1.5"], "--min-lr-ratio"),
        (&["--grad-clip", "inf"], "--grad-clip"),
        // A negative value written apart from its flag is the flag's value, not a flag.
        (&["--grad-clip", "-1"], "--grad-clip"),
        (&["--lr", "-0.5"], "--lr"),
        (&["--weight-decay=-0.1"], "--weight-decay"),
        (&["--prefetch-units", &max], "--prefetch-units"),
        (&["--reduce-bucket-size", "0"], "--reduce-bucket-size"),
        (&["--memory-limit", "0"], "--memory-limit"),
        (&["--top-k", "0"], "--top-k"),
        (&["--layers", "0"], "--layers"),
        (&["--eval-batches", "0"], "--eval-batches"),
    ];
    for (flags, name) in cases {
        let err = resolve(flags).unwrap_err();
        assert!(err.to_string().contains(name), "{flags:?}: {err}");
    }
}

#[test]
fn accumulation_fills_the_global_batch() {
    let cfg = resolve(&[
        "--batch-size",
        "32",
        "--micro-batch-size",
        "2",
        "--world-size",
        "4",
    ])
    .unwrap();
    assert_eq!(cfg.grad_accum_steps(), 4);
}

fn count() -> impl Strategy<Value = usize> {
    prop_oneof![
        Just(0usize),
        Just(1),
        Just(usize::MAX),
        Just(usize::MAX / 2 + 1),
        1usize..9,
        any::<usize>(),
    ]
}

fn steps() -> impl Strategy<Value = u64> {
    prop_oneof![Just(0u64), Just(u64::MAX), 0u64..100, any::<u64>()]
}

fn real() -> impl Strategy<Value = f32> {
    prop_oneof![
        Just(f32::NAN),
        Just(f32::INFINITY),
        Just(f32::NEG_INFINITY),
        Just(-1.0f32),
        Just(0.0),
        0.0f32..2.0,
        any::<f32>(),
    ]
}

fn maybe(s: impl Strategy<Value = usize>) -> impl Strategy<Value = Option<usize>> {
    prop::option::of(s)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Random values, limits included, give an error or a configuration whose arithmetic is
    /// safe; never a panic.
    #[test]
    fn validation_never_panics(
        shape in (maybe(count()), maybe(count()), maybe(count()), maybe(count()), count()),
        batch in (count(), count(), count(), count(), count()),
        sched in (steps(), steps(), steps(), steps(), real(), real(), real(), real()),
        engine in (0u8..4, any::<u64>(), count(), count(), prop::option::of(any::<u64>())),
        samples in (count(), count()),
    ) {
        let cfg = TrainConfig {
            model: "tiny".into(),
            layers: shape.0, heads: shape.1, dim: shape.2, vocab: shape.3, seq_len: shape.4,
            world_size: batch.0, batch_size: batch.1, micro_batch_size: batch.2,
            eval_batches: batch.3, top_k: batch.4,
            steps: sched.0, warmup_steps: sched.1, eval_every: sched.2, save_every: sched.3,
            lr: sched.4, min_lr_ratio: sched.5, weight_decay: sched.6, grad_clip: sched.7,
            zero_stage: ZeroStage::from_index(engine.0).unwrap(),
            reduce_bucket_size: ByteSize(engine.1),
            prefetch_units: engine.2,
            param_persistence_threshold: engine.3,
            memory_limit: engine.4.map(ByteSize),
            sample_tokens: samples.0,
            seed: samples.1 as u64,
            ..TrainConfig::default()
        };
        if let Ok(model) = cfg.validate() {
            prop_assert!((1..=MAX_RANKS).contains(&cfg.world_size));
            let per_step = cfg.grad_accum_steps() * cfg.micro_batch_size * cfg.world_size;
            prop_assert_eq!(per_step, cfg.batch_size);
            prop_assert!(cfg.batch_size * cfg.seq_len <= MAX_BATCH_TOKENS);
            prop_assert!(cfg.lr.is_finite() && cfg.lr > 0.0);
            prop_assert!((0.0..=1.0).contains(&cfg.min_lr_ratio));
            prop_assert!(cfg.grad_clip.is_finite() && cfg.weight_decay.is_finite());
            let units = model.num_layers + 2;
            prop_assert!(cfg.prefetch_units <= units);
        }
    }

    /// Any integer text for the integer flags resolves or is refused; never a panic.
    #[test]
    fn integer_flags_never_panic(
        flag in prop::sample::select(vec![
            "--world-size", "--batch-size", "--micro-batch-size", "--seq-len", "--steps",
            "--prefetch-units", "--eval-batches", "--top-k", "--sample-tokens", "--layers",
            "--heads", "--dim", "--vocab", "--warmup-steps", "--reduce-bucket-size",
        ]),
        value in prop_oneof![Just(u64::MAX), Just(0u64), any::<u64>(), 0u64..64],
    ) {
        let text = value.to_string();
        if let Ok(args) = parse(&["--model", "tiny", flag, &text]) {
            if let Err(e) = args.resolve() {
                prop_assert!(!e.to_string().is_empty());
            }
        }
    }
}

#[test]
fn a_global_batch_left_out_is_one_micro_batch_per_local_rank() {
    let batch = |flags: &[&str]| resolve(flags).map(|c| c.batch_size);
    assert_eq!(batch(&[]).unwrap(), 4 * 2);
    assert_eq!(batch(&["--world-size", "4"]).unwrap(), 4 * 4);
    assert_eq!(
        batch(&["--world-size", "3", "--micro-batch-size", "2"]).unwrap(),
        2 * 3
    );
    // Given, it is kept, and must divide into the ranks.
    assert_eq!(
        batch(&["--world-size", "4", "--batch-size", "32"]).unwrap(),
        32
    );
    let err = batch(&["--world-size", "4", "--batch-size", "8"]).unwrap_err();
    assert!(err.to_string().contains("a multiple of 16"), "{err}");
    // Given in the file, under DeepSpeed's name, it is kept too.
    let file = TomlFile::new("batch", "train_batch_size = 24\n");
    let path = file.path();
    let flags = ["--config", path.to_str().unwrap(), "--world-size", "3"];
    assert_eq!(batch(&flags).unwrap(), 24);
}

#[test]
fn launched_ranks_keep_the_default_global_batch() {
    // Their world size is the launcher's, known only once joined.
    let cfg = parse(&["--backend", "tcp"]).unwrap().merge().unwrap();
    assert_eq!(cfg.batch_size, TrainConfig::default().batch_size);
}

#[test]
fn an_on_off_flag_turns_off_what_the_file_turned_on() {
    let file = TomlFile::new(
        "switch",
        "activation_checkpointing = true\noffload_optimizer = true\n",
    );
    let path = file.path();
    let config = ["--config", path.to_str().unwrap()];
    let from_file = resolve(&config).unwrap();
    assert!(from_file.activation_checkpointing);
    assert_eq!(from_file.offload_optimizer, OffloadTier::Cpu);
    let off = resolve(&[&config[..], &["--activation-checkpointing=false"]].concat()).unwrap();
    assert!(!off.activation_checkpointing);
    assert_eq!(off.offload_optimizer, OffloadTier::Cpu);
    let off = resolve(&[&config[..], &["--offload-optimizer=false"]].concat()).unwrap();
    assert_eq!(off.offload_optimizer, OffloadTier::Off);
    // Alone, the flag turns the setting on.
    let alone = resolve(&["--offload-optimizer"]).unwrap();
    assert_eq!(alone.offload_optimizer, OffloadTier::Cpu);
}

#[test]
fn the_optimizer_offload_takes_a_tier_from_flags_and_files() {
    let tier = |flags: &[&str]| parse(flags).map(|a| a.merge().unwrap().offload_optimizer);
    assert_eq!(tier(&[]).unwrap(), OffloadTier::Off);
    assert_eq!(tier(&["--offload-optimizer"]).unwrap(), OffloadTier::Cpu);
    // Bare and followed by another flag: the next flag is not taken as its value.
    let bare = parse(&["--offload-optimizer", "--steps", "3"])
        .unwrap()
        .merge()
        .unwrap();
    assert_eq!((bare.offload_optimizer, bare.steps), (OffloadTier::Cpu, 3));
    assert_eq!(
        tier(&["--offload-optimizer", "nvme"]).unwrap(),
        OffloadTier::Nvme
    );
    assert_eq!(
        tier(&["--offload-optimizer=nvme"]).unwrap(),
        OffloadTier::Nvme
    );
    assert_eq!(
        tier(&["--offload-optimizer", "cpu"]).unwrap(),
        OffloadTier::Cpu
    );
    assert_eq!(
        tier(&["--offload-optimizer=false"]).unwrap(),
        OffloadTier::Off
    );
    let err = parse(&["--offload-optimizer", "disk"])
        .unwrap_err()
        .to_string();
    assert!(err.contains("\"disk\"") && err.contains("nvme"), "{err}");
    for (text, want) in [
        ("true", OffloadTier::Cpu),
        ("false", OffloadTier::Off),
        ("\"cpu\"", OffloadTier::Cpu),
        ("\"nvme\"", OffloadTier::Nvme),
    ] {
        // nvme is validated with its folder: any existing, writable one.
        let dir = std::env::temp_dir().display().to_string();
        let text = match want {
            OffloadTier::Nvme => format!("{text}\nnvme_path = {dir:?}"),
            _ => text.to_string(),
        };
        let file = TomlFile::new("tier", &format!("offload_optimizer = {text}\n"));
        let cfg = resolve(&["--config", file.path().to_str().unwrap()]).unwrap();
        assert_eq!(cfg.offload_optimizer, want, "offload_optimizer = {text}");
    }
    let file = TomlFile::new("tier-bad", "offload_optimizer = \"tape\"\n");
    let err = resolve(&["--config", file.path().to_str().unwrap()]).unwrap_err();
    assert!(err.to_string().contains("tape"), "{err}");
}
