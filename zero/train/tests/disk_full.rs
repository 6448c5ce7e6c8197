//! A disk that fills up under a run whose `nvme` tier files and checkpoints are on it: the
//! tier files' bytes are reserved at start-up, so the steps go on; the save that finds no
//! room is refused naming its folder and the bytes; nothing is left half-written, the tier
//! files go with the run, and the last saved checkpoint resumes to the losses of a run that
//! never stopped, to the bit. Needs a small tmpfs, which needs root: skipped with the
//! reason otherwise.

mod common;
use common::{tiny_stage3, write_corpus, TempDir};
use std::path::{Path, PathBuf};
use std::process::Command;
use zero_gpt::Rng;
use zero_train::{train, OffloadTier, TrainConfig};

/// A tmpfs of `size` mounted at a folder, unmounted on drop.
struct Mount(PathBuf);

impl Mount {
    fn tmpfs(at: &Path, size: &str) -> Option<Self> {
        std::fs::create_dir_all(at).ok()?;
        let options = format!("size={size}");
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &options, "tmpfs"])
            .arg(at)
            .output()
            .ok()?;
        mounted.status.success().then(|| Self(at.to_path_buf()))
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// [`tiny_stage3`] with both tiers in files under `nvme`.
fn tiny(data: &Path, nvme: &Path) -> TrainConfig {
    TrainConfig {
        offload_optimizer: OffloadTier::Nvme,
        offload_params: OffloadTier::Nvme,
        nvme_path: Some(nvme.to_path_buf()),
        ..tiny_stage3(data)
    }
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn a_full_disk_refuses_the_save_naming_the_bytes_and_the_last_checkpoint_resumes() {
    let dir = TempDir::new("disk-full");
    let mut rng = Rng::new(3);
    let tokens: Vec<u16> = (0..6_000).map(|_| (rng.next_u64() % 100) as u16).collect();
    write_corpus(&dir.0, &tokens, 2_000, 100);
    let roomy = dir.0.join("roomy");
    std::fs::create_dir(&roomy).unwrap();
    // Room for the tier files (about 420 KB) and two checkpoints of about 370 KB, not three.
    let Some(disk) = Mount::tmpfs(&dir.0.join("disk"), "1100k") else {
        eprintln!("skipped: cannot mount a tmpfs here (it needs root)");
        return;
    };
    let whole = train(&tiny(&dir.0, &roomy)).unwrap().losses;
    let save = disk.0.join("ckpt");
    let failed = train(&TrainConfig {
        save: Some(save.clone()),
        save_every: 1,
        ..tiny(&dir.0, &disk.0)
    })
    .unwrap_err()
    .to_string();
    let partial = save.join("step-000002.partial");
    assert!(failed.contains(&partial.display().to_string()), "{failed}");
    assert!(
        failed.contains("its disk is full: this rank's pieces need"),
        "{failed}"
    );
    assert!(
        failed.contains("bytes free when the save began"),
        "{failed}"
    );
    // No tier file, no half-written state: the saved step and the pointer to it.
    assert_eq!(entries(&disk.0), ["ckpt"]);
    assert_eq!(entries(&save), ["latest", "step-000001"]);
    let resumed = train(&TrainConfig {
        resume: Some(save.join("step-000001")),
        ..tiny(&dir.0, &disk.0)
    })
    .unwrap()
    .losses;
    let bits = |l: &[f32]| l.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&resumed), bits(&whole[1..]));
}
