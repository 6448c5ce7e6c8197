//! `--delayed-param-update` through zero-train: the first step's loss is the undelayed run's
//! (both read the initial parameters) and the later ones are not (the delayed run reads
//! parameters one step stale); the last step's update lands before the run ends, so a
//! one-step run exports the undelayed run's parameters byte for byte; with the optimizer's
//! states and the parameter shards in files (stage 3), the delayed run's losses are the host
//! tier's to the bit; and a configuration it cannot run in is refused naming the flag.

mod common;
use common::{loss_bits, offload_corpus, tiny_stage3, TempDir};
use std::path::Path;
use zero::ZeroStage;
use zero_train::{train, OffloadTier, TrainConfig};

fn corpus(dir: &Path) {
    offload_corpus(dir, 17);
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

/// Stage 3 with the optimizer and the parameter shards at `tiers`, delayed.
fn in_tiers(data: &Path, tiers: (OffloadTier, OffloadTier)) -> TrainConfig {
    let files = tiers.0 == OffloadTier::Nvme || tiers.1 == OffloadTier::Nvme;
    TrainConfig {
        zero_stage: ZeroStage::Zero3,
        offload_optimizer: tiers.0,
        offload_params: tiers.1,
        nvme_path: files.then(|| data.join("nvme")),
        ..tiny(data, true)
    }
}

#[test]
fn the_delayed_update_from_files_trains_the_host_tiers_losses_to_the_bit() {
    let dir = TempDir::new("dpu-files");
    corpus(&dir.0);
    use OffloadTier::{Cpu, Nvme, Off};
    let host = train(&in_tiers(&dir.0, (Cpu, Off))).unwrap().losses;
    for tiers in [(Nvme, Off), (Cpu, Cpu), (Nvme, Nvme)] {
        let run = train(&in_tiers(&dir.0, tiers)).unwrap();
        assert_eq!(loss_bits(&run.losses), loss_bits(&host), "{tiers:?}");
        if tiers.0 == Nvme {
            // Every step's stream, run on the update's thread, is counted: each rank's
            // files write per step what they write without the delay, and read as much
            // plus at most one set of parameter shards over the run: the reads sent for a
            // next run by the last update the run applies, which its final landing drops
            // (the run without the delay never takes its last ones).
            let mut plain = in_tiers(&dir.0, tiers);
            plain.delayed_param_update = false;
            let plain = train(&plain).unwrap();
            for (r, p) in run.ranks.iter().zip(&plain.ranks) {
                let (io, want) = (r.file_io_per_step, p.file_io_per_step);
                assert!(io.read_bytes > 0, "{tiers:?} rank {}", r.rank);
                assert_eq!(io.written_bytes, want.written_bytes, "{tiers:?}");
                let extra = io.read_bytes.checked_sub(want.read_bytes);
                let within = extra.is_some_and(|x| x <= r.params_file_bytes);
                assert!(within, "{tiers:?}: {io:?} against {want:?}");
            }
        }
    }
    let undelayed = TrainConfig {
        delayed_param_update: false,
        ..in_tiers(&dir.0, (Cpu, Off))
    };
    let undelayed = train(&undelayed).unwrap().losses;
    assert_ne!(
        host[1].to_bits(),
        undelayed[1].to_bits(),
        "the update was not delayed"
    );
}

#[test]
fn the_delayed_update_without_the_optimizer_offloaded_is_refused_naming_the_flag() {
    let dir = TempDir::new("dpu-refused");
    corpus(&dir.0);
    let err = train(&TrainConfig {
        offload_optimizer: OffloadTier::Off,
        ..tiny(&dir.0, true)
    })
    .unwrap_err()
    .to_string();
    assert!(err.contains("--delayed-param-update"), "{err}");
}

/// The run's last update lands after its last step, with the all-gathers that apply it at
/// stage 2: they count with the run's traffic, so a delayed run reports per step what the
/// undelayed one does.
#[test]
fn a_delayed_run_counts_the_traffic_of_its_last_update() {
    let dir = TempDir::new("dpu-traffic");
    corpus(&dir.0);
    let delayed = train(&tiny(&dir.0, true)).unwrap();
    let plain = train(&tiny(&dir.0, false)).unwrap();
    for (d, p) in delayed.ranks.iter().zip(&plain.ranks) {
        assert!(p.traffic_per_step.all_gather > 0, "stage 2 all-gathers");
        assert_eq!(d.traffic_per_step, p.traffic_per_step, "rank {}", d.rank);
        let bytes = |r: &zero_train::run::metrics::RankReport| {
            (r.comm_bytes_sent_per_step, r.comm_bytes_received_per_step)
        };
        assert_eq!(bytes(d), bytes(p), "rank {}", d.rank);
    }
}
