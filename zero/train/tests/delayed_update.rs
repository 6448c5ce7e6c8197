//! `--delayed-param-update` through zero-train: the first step's loss is the undelayed run's
//! (both read the initial parameters) and the later ones are not (the delayed run reads
//! parameters one step stale); the last step's update lands before the run ends, so a
//! one-step run exports the undelayed run's parameters byte for byte; and a configuration
//! it cannot run in is refused naming the flag.

mod common;
use common::{tiny_stage3, write_corpus, TempDir};
use std::path::Path;
use zero::ZeroStage;
use zero_gpt::Rng;
use zero_train::{train, OffloadTier, TrainConfig};

fn corpus(dir: &Path) {
    let mut rng = Rng::new(17);
    let tokens: Vec<u16> = (0..6_000).map(|_| (rng.next_u64() % 100) as u16).collect();
    write_corpus(dir, &tokens, 2_000, 100);
}

/// [`tiny_stage3`] at stage 2 with the optimizer on the host, delayed or not.
fn tiny(data: &Path, delayed: bool) -> TrainConfig {
    TrainConfig {
        zero_stage: ZeroStage::Zero2,
        offload_optimizer: OffloadTier::Cpu,
        delayed_param_update: delayed,
        lr: 1e-2,
        ..tiny_stage3(data)
    }
}

#[test]
fn the_first_step_matches_the_undelayed_run_and_the_later_ones_read_stale_parameters() {
    let dir = TempDir::new("dpu-losses");
    corpus(&dir.0);
    let delayed = train(&tiny(&dir.0, true)).unwrap().losses;
    let plain = train(&tiny(&dir.0, false)).unwrap().losses;
    assert_eq!(delayed[0].to_bits(), plain[0].to_bits());
    // Step 2 of the delayed run reads the initial parameters, the undelayed one the updated.
    assert_ne!(delayed[1].to_bits(), plain[1].to_bits());
    assert!(delayed.iter().all(|l| l.is_finite()), "{delayed:?}");
}

#[test]
fn a_one_step_run_lands_its_update_before_it_exports() {
    let dir = TempDir::new("dpu-export");
    corpus(&dir.0);
    let export = |delayed: bool| {
        let out = dir.0.join(format!("params-{delayed}.bin"));
        train(&TrainConfig {
            steps: 1,
            export_llmc: Some(out.clone()),
            ..tiny(&dir.0, delayed)
        })
        .unwrap();
        std::fs::read(out).unwrap()
    };
    assert!(export(true) == export(false));
}

#[test]
fn the_delayed_update_without_the_host_optimizer_is_refused_naming_the_flag() {
    let dir = TempDir::new("dpu-refused");
    corpus(&dir.0);
    for tier in [OffloadTier::Off, OffloadTier::Nvme] {
        let err = train(&TrainConfig {
            offload_optimizer: tier,
            nvme_path: Some(dir.0.clone()),
            ..tiny(&dir.0, true)
        })
        .unwrap_err()
        .to_string();
        assert!(err.contains("--delayed-param-update"), "{tier:?}: {err}");
    }
}
