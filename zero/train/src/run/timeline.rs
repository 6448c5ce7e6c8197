//! `--trace FILE`: the ranks' engine timelines as one Chrome trace document per process
//! ([`zero::chrome_trace`]), one process (`pid`) per rank. A process that holds every rank
//! (the local backend) writes FILE; a rank in a process of its own (mpi, tcp, nccl) writes
//! FILE with `.rankN` before its extension, so the ranks of one run never overwrite each
//! other.

use super::RankOutput;
use crate::error::TrainError;
use crate::fsio::failed;
use std::path::{Path, PathBuf};

/// Writes the timelines the ranks of `outputs` recorded, in a run of `world` ranks.
///
/// # Errors
/// [`TrainError::Io`] when the file cannot be written.
pub(crate) fn write(path: &Path, world: usize, outputs: &[RankOutput]) -> Result<(), TrainError> {
    let traces: Vec<(usize, &zero::Trace)> = outputs
        .iter()
        .filter_map(|o| Some((o.report.rank, o.trace.as_ref()?)))
        .collect();
    let path = match (outputs.len() == world, traces.first()) {
        (false, Some(&(rank, _))) => rank_path(path, rank),
        _ => path.to_path_buf(),
    };
    let json = zero::chrome_trace(&traces).to_string();
    std::fs::write(&path, json).map_err(failed("write the --trace file", &path))?;
    Ok(())
}

/// `path` with `.rankN` before its extension (`trace.json` -> `trace.rank1.json`).
fn rank_path(path: &Path, rank: usize) -> PathBuf {
    let stem = path.file_stem().unwrap_or_default().to_string_lossy();
    let name = match path.extension() {
        Some(ext) => format!("{stem}.rank{rank}.{}", ext.to_string_lossy()),
        None => format!("{stem}.rank{rank}"),
    };
    path.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::rank_path;
    use std::path::Path;

    #[test]
    fn a_rank_of_its_own_writes_beside_the_file_named() {
        assert_eq!(
            rank_path(Path::new("out/t.json"), 3),
            Path::new("out/t.rank3.json")
        );
        assert_eq!(rank_path(Path::new("trace"), 0), Path::new("trace.rank0"));
    }
}
