//! The optimizer offload's flags checked before the ranks start: `--offload-optimizer nvme`
//! with an existing, writable `--nvme-path` directory, and `--nvme-path` or
//! `--host-memory-limit` only where they mean something. Each refusal names the flag and,
//! for the folder, the path and what the system said.

use crate::cli::config::{OffloadTier, TrainConfig};
use crate::error::ConfigError;
use std::path::Path;

impl TrainConfig {
    /// Refuses an offload configuration that cannot run (module docs).
    pub(crate) fn validate_offload(&self) -> Result<(), ConfigError> {
        let invalid = |why: String| Err(ConfigError::Invalid(why));
        if let Some(limit) = self.host_memory_limit {
            if !self.offload_optimizer.is_on() {
                return invalid(
                    "--host-memory-limit caps the host arena of --offload-optimizer: give both, \
                     or leave it out"
                        .into(),
                );
            }
            if limit.0 == 0 {
                return invalid("--host-memory-limit 0: the host arena needs bytes".into());
            }
        }
        match (self.offload_optimizer, &self.nvme_path) {
            (OffloadTier::Nvme, None) => invalid(
                "--offload-optimizer nvme keeps the optimizer states in files: give the folder \
                 with --nvme-path DIR (`nvme_path` in --config)"
                    .into(),
            ),
            (OffloadTier::Nvme, Some(_)) if self.device.is_cuda() => invalid(
                "--offload-optimizer nvme runs on the CPU only for now: use \
                 --offload-optimizer cpu with --device cuda"
                    .into(),
            ),
            (OffloadTier::Nvme, Some(dir)) => writable_dir(dir),
            (_, Some(dir)) => invalid(format!(
                "--nvme-path {} is the folder of --offload-optimizer nvme's files: give \
                 --offload-optimizer nvme, or leave --nvme-path out",
                dir.display()
            )),
            (_, None) => Ok(()),
        }
    }
}

/// `dir` is a directory this process can create files in: checked by creating and removing
/// a probe file, since permission bits say nothing for root or on read-only mounts.
fn writable_dir(dir: &Path) -> Result<(), ConfigError> {
    let shown = dir.display();
    let refuse = |why: String| Err(ConfigError::Invalid(format!("--nvme-path {shown}: {why}")));
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return refuse("is not a directory".into()),
        Err(e) => return refuse(format!("is not a directory one can use ({e})")),
    }
    let probe = dir.join(format!(".zero-nvme-probe-{}", std::process::id()));
    match std::fs::File::create(&probe) {
        Ok(_) => {
            // The probe proved the folder writable; one left behind is harmless.
            let _ = std::fs::remove_file(&probe);
            Ok(())
        }
        Err(e) => refuse(format!("cannot create files in it ({e})")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_under_a_regular_file_is_refused_by_name() {
        let file = std::env::temp_dir().join(format!("zero-nvme-file-{}", std::process::id()));
        std::fs::write(&file, b"x").unwrap();
        let under = file.join("sub");
        let err = writable_dir(&under).unwrap_err().to_string();
        assert!(err.contains(&under.display().to_string()), "{err}");
        assert!(err.contains("not a directory"), "{err}");
        assert!(writable_dir(&file)
            .unwrap_err()
            .to_string()
            .contains("is not a directory"));
        std::fs::remove_file(&file).unwrap();
    }
}
