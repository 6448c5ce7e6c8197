//! The offload flags checked before the ranks start: an `nvme` tier with an existing,
//! writable `--nvme-path` directory, `--offload-params` at stage 3 with
//! `--offload-optimizer`, `--offload-gradients` with `--offload-optimizer`, and `--nvme-path`
//! or `--host-memory-limit` only where they mean something. Each refusal names the flag and,
//! for the folder, the path and what the system said.

use crate::cli::config::{OffloadTier, TrainConfig};
use crate::error::ConfigError;
use std::path::Path;
use zero::ZeroStage;

impl TrainConfig {
    /// Refuses an offload configuration that cannot run (module docs).
    pub(crate) fn validate_offload(&self) -> Result<(), ConfigError> {
        let invalid = |why: String| Err(ConfigError::Invalid(why));
        if let Some(limit) = self.host_memory_limit {
            if !self.offload_optimizer.is_on() {
                return invalid(
                    "--host-memory-limit caps the host memory of --offload-optimizer (and \
                     --offload-params): give both, or leave it out"
                        .into(),
                );
            }
            if limit.0 == 0 {
                return invalid("--host-memory-limit 0: the host arena needs bytes".into());
            }
        }
        self.validate_param_offload()?;
        if self.delayed_param_update && !self.offload_optimizer.is_on() {
            return invalid(
                "--delayed-param-update runs the host update of --offload-optimizer on a \
                 thread: give --offload-optimizer cpu or nvme"
                    .into(),
            );
        }
        self.validate_grad_offload()?;
        let nvme = [
            (
                self.offload_optimizer,
                "--offload-optimizer nvme",
                "optimizer states",
            ),
            (
                self.offload_params,
                "--offload-params nvme",
                "parameter shards",
            ),
        ];
        let asked = nvme.iter().find(|(tier, ..)| *tier == OffloadTier::Nvme);
        match (asked, &self.nvme_path) {
            (Some((_, flag, what)), None) => invalid(format!(
                "{flag} keeps the {what} in files: give the folder with --nvme-path DIR \
                 (`nvme_path` in --config)"
            )),
            (Some(_), Some(dir)) => writable_dir(dir),
            (None, Some(dir)) => invalid(format!(
                "--nvme-path {} is the folder of the nvme tier's files: give \
                 --offload-optimizer nvme or --offload-params nvme, or leave --nvme-path out",
                dir.display()
            )),
            (None, None) => Ok(()),
        }
    }

    /// `--offload-gradients` only with `--offload-optimizer` (its host update reads them).
    fn validate_grad_offload(&self) -> Result<(), ConfigError> {
        if !self.offload_gradients || self.offload_optimizer.is_on() {
            return Ok(());
        }
        Err(ConfigError::Invalid(
            "--offload-gradients needs --offload-optimizer (cpu or nvme): its host update \
             reads the gradients"
                .into(),
        ))
    }

    /// `--offload-params` only at stage 3 and with `--offload-optimizer`: below stage 3
    /// nothing is gathered, and the host update reads and writes the shards where they live.
    fn validate_param_offload(&self) -> Result<(), ConfigError> {
        if !self.offload_params.is_on() {
            return Ok(());
        }
        if self.zero_stage != ZeroStage::Zero3 {
            return Err(ConfigError::Invalid(format!(
                "--offload-params keeps the parameter shards of stage 3 off the device: it \
                 needs --zero-stage 3 (this run asks for {})",
                self.zero_stage as u8
            )));
        }
        if !self.offload_optimizer.is_on() {
            return Err(ConfigError::Invalid(
                "--offload-params needs --offload-optimizer (cpu or nvme) too: the update runs \
                 on the host, where the shards are"
                    .into(),
            ));
        }
        Ok(())
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
