//! What a run reports: JSON lines for machines (`--metrics FILE`), lines or a progress bar
//! for people, and the closing per-rank memory and traffic table.

use crate::error::TrainError;
use crate::fsio::failed;
use crate::run::resident::Resident;
use crate::run::tp_traffic::TpTrafficPerStep;
use serde_json::{json, Value};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use zero::{ModelStateBytes, Traffic};

/// One optimizer step as reported.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepMetrics {
    /// Step number, from 1.
    pub step: u64,
    /// Mean loss over the global batch.
    pub loss: f32,
    /// Learning rate used.
    pub lr: f32,
    /// Global gradient norm before clipping.
    pub grad_norm: f32,
    /// Training throughput of the step.
    pub tokens_per_s: f64,
    /// Wall time of the step.
    pub step_ms: f64,
    /// The loss scale the step ran under (fp16; 1 otherwise).
    pub loss_scale: f32,
    /// fp16 gradients overflowed and the step was skipped.
    pub skipped: bool,
    /// Rank 0's arena: the peak bytes allocated so far.
    pub peak_bytes: u64,
    /// Rank 0's start-up plan: what its arena holds at the step's peak.
    pub plan_bytes: u64,
    /// Rank 0's collective staging that did not fit the block its arena lent the backend
    /// (0 for the local backend, which stages nothing).
    pub staging_outside_bytes: u64,
    /// The process's resident memory (every local rank, and what lives outside the
    /// arenas), where the OS reports it.
    pub resident: Option<Resident>,
    /// Rank 0's arena: compactions during this step (memory defragmentation, ZeRO-R's MD).
    pub defrags: u64,
    /// Rank 0's arena: bytes those compactions moved.
    pub defrag_bytes_moved: u64,
}

/// Memory and traffic of one rank at the end of a run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RankReport {
    /// The rank.
    pub rank: usize,
    /// Model-state bytes measured from the arena.
    pub measured: ModelStateBytes,
    /// The paper's formula for this configuration.
    pub expected: ModelStateBytes,
    /// The paper's formula at stage 0 (the baseline the saving is against).
    pub stage0: ModelStateBytes,
    /// Highest bytes allocated from the rank's arena.
    pub peak_bytes: u64,
    /// Bytes of the rank's activations in its arena (with activation checkpointing, one
    /// segment and the kept block inputs, or with offload the staging slots in their place).
    pub activation_bytes: u64,
    /// The part of `activation_bytes` the engine holds for the kept block inputs: each
    /// input, or the staging slots when offloaded; partitioned (P_a), the slices and the
    /// whole-input buffer they are gathered into (0 without checkpointing).
    pub activation_kept_bytes: u64,
    /// Bytes of kept block inputs offloaded to pinned host memory (0 without offload).
    pub activation_offloaded_bytes: u64,
    /// ZeRO-Offload: the peak of the host arena of optimizer states (the states and one
    /// unit's update staging; 0 without `--offload-optimizer`). `model_state_bytes` counts
    /// the states wherever they are.
    pub optimizer_offloaded_bytes: u64,
    /// `--offload-gradients`: bytes of the kept gradients in host memory, measured from
    /// their blocks (0 otherwise).
    pub grads_offloaded_bytes: u64,
    /// `--offload-gradients` beside `--delayed-param-update`: the peak of the gradients'
    /// own host arena (0 otherwise: they share the optimizer's host arena, or stay on the
    /// device).
    pub grads_arena_peak_bytes: u64,
    /// `--offload-optimizer nvme`: bytes of the rank's optimizer file, measured on disk
    /// while the run holds it (0 without the file tier).
    pub optimizer_file_bytes: u64,
    /// `--offload-params cpu`: the peak of the host arena of parameter shards (0 otherwise).
    pub params_offloaded_bytes: u64,
    /// `--offload-params nvme`: bytes of the rank's parameter file, measured on disk while
    /// the run holds it (0 otherwise).
    pub params_file_bytes: u64,
    /// What the rank's files (`nvme` tiers) read and wrote per training step, and the
    /// seconds those reads and writes took.
    pub file_io_per_step: zero::FileIo,
    /// Elements handed to collectives per training step, by kind.
    pub traffic_per_step: Traffic,
    /// Bytes zero-comm counted as sent per training step (all collectives).
    pub comm_bytes_sent_per_step: f64,
    /// Bytes zero-comm counted as received per training step (all collectives).
    pub comm_bytes_received_per_step: f64,
    /// The tensor-parallel group's collectives per training step (`None` at T = 1).
    pub tensor_parallel: Option<TpTrafficPerStep>,
}

fn bytes_json(b: &ModelStateBytes) -> Value {
    json!({
        "parameters": b.params,
        "gradients": b.grads,
        "optimizer": b.optimizer,
        "total": b.total(),
    })
}

impl RankReport {
    /// The rank's entry in the summary line.
    pub fn to_json(&self) -> Value {
        let t = &self.traffic_per_step;
        json!({
            "rank": self.rank,
            "peak_bytes": self.peak_bytes,
            "activation_bytes": self.activation_bytes,
            "activation_kept_bytes": self.activation_kept_bytes,
            "activation_offloaded_bytes": self.activation_offloaded_bytes,
            "optimizer_offloaded_bytes": self.optimizer_offloaded_bytes,
            "grads_offloaded_bytes": self.grads_offloaded_bytes,
            "grads_arena_peak_bytes": self.grads_arena_peak_bytes,
            "optimizer_file_bytes": self.optimizer_file_bytes,
            "params_offloaded_bytes": self.params_offloaded_bytes,
            "params_file_bytes": self.params_file_bytes,
            "file_io_per_step": {
                "read_bytes": self.file_io_per_step.read_bytes,
                "written_bytes": self.file_io_per_step.written_bytes,
                "read_seconds": self.file_io_per_step.read_seconds,
                "write_seconds": self.file_io_per_step.write_seconds,
                "pooled_bytes": self.file_io_per_step.pooled_bytes,
            },
            "model_state_bytes": bytes_json(&self.measured),
            "expected_model_state_bytes": bytes_json(&self.expected),
            "stage0_model_state_bytes": bytes_json(&self.stage0),
            "comm_bytes_per_step": {
                "all_reduce_elements": t.all_reduce,
                "reduce_scatter_elements": t.reduce_scatter,
                "all_gather_elements": t.all_gather,
                "paper_elements": t.elements(),
                "bytes_sent": self.comm_bytes_sent_per_step,
                "bytes_received": self.comm_bytes_received_per_step,
            },
            "tensor_parallel_per_step": self.tensor_parallel.map(|t| t.to_json()),
        })
    }
}

/// The `--metrics` JSON-lines file.
#[derive(Debug)]
pub struct MetricsFile {
    path: PathBuf,
    out: BufWriter<File>,
}

impl MetricsFile {
    /// Creates (truncates) the file.
    ///
    /// # Errors
    /// [`TrainError::Io`] naming the file.
    pub fn create(path: &Path) -> Result<Self, TrainError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(failed("create directory", dir))?;
        }
        let file = File::create(path).map_err(failed("create the --metrics file", path))?;
        Ok(Self {
            path: path.to_path_buf(),
            out: BufWriter::new(file),
        })
    }

    /// Appends one JSON object as a line, flushed so a crash loses nothing written.
    ///
    /// # Errors
    /// [`TrainError::Io`].
    pub fn write(&mut self, value: &Value) -> Result<(), TrainError> {
        writeln!(self.out, "{value}").map_err(failed("write", &self.path))?;
        self.out.flush().map_err(failed("write", &self.path))?;
        Ok(())
    }
}

/// The step's JSON line.
pub fn step_json(m: &StepMetrics) -> Value {
    json!({
        "step": m.step,
        "loss": m.loss,
        "lr": m.lr,
        "grad_norm": m.grad_norm,
        "tokens_per_s": m.tokens_per_s,
        "step_ms": m.step_ms,
        "loss_scale": m.loss_scale,
        "skipped": m.skipped,
        "peak_bytes": m.peak_bytes,
        "plan_bytes": m.plan_bytes,
        "staging_outside_bytes": m.staging_outside_bytes,
        "process_rss_bytes": m.resident.map(|r| r.now),
        "process_rss_peak_bytes": m.resident.map(|r| r.peak),
        "defrags": m.defrags,
        "defrag_bytes_moved": m.defrag_bytes_moved,
    })
}

/// The closing table: per rank, model states measured against stage 0 and the traffic.
pub fn memory_table(reports: &[RankReport]) -> String {
    let mut s = String::from(
        "rank | model states measured | formula | stage 0 would need | saving | activations | traffic/step (elements: RS + AG + 2 x AR)\n",
    );
    for r in reports {
        let saving = 1.0 - r.measured.total() / r.stage0.total().max(1.0);
        // A saving that rounds to 0.0% prints as such, not as "-0.0%".
        let saving = if saving.abs() < 5e-4 { 0.0 } else { saving };
        s.push_str(&format!(
            "{:>4} | {:>17.2} MiB | {:>7.2} MiB | {:>14.2} MiB | {:>5.1}% | {:>7.2} MiB | {}\n",
            r.rank,
            mib(r.measured.total()),
            mib(r.expected.total()),
            mib(r.stage0.total()),
            100.0 * saving,
            mib(r.activation_bytes as f64),
            r.traffic_per_step.elements()
        ));
    }
    for (rank, t) in reports
        .iter()
        .filter_map(|r| Some((r.rank, r.tensor_parallel?)))
    {
        s.push_str(&format!(
            "rank {rank}: tensor-parallel group per step: {:.0} all-reduces, {:.0} all-gathers, \
             {:.2} MiB sent, {:.2} MiB received\n",
            t.all_reduces,
            t.all_gathers,
            mib(t.bytes_sent),
            mib(t.bytes_received),
        ));
    }
    s.push_str(&offload_lines(reports));
    s
}

/// Bytes in MiB.
fn mib(bytes: f64) -> f64 {
    bytes / (1024.0 * 1024.0)
}

/// The closing table's lines on the offloaded tiers: where each rank's optimizer states and
/// parameter shards are, and what its files moved per step.
fn offload_lines(reports: &[RankReport]) -> String {
    let mut s = String::new();
    for r in reports.iter().filter(|r| r.optimizer_offloaded_bytes > 0) {
        let home = if r.optimizer_file_bytes > 0 {
            format!(
                "in its file (--offload-optimizer nvme; {:.2} MiB on disk",
                mib(r.optimizer_file_bytes as f64)
            )
        } else {
            "in host memory (--offload-optimizer".to_string()
        };
        let grads = match (r.grads_offloaded_bytes, r.grads_arena_peak_bytes) {
            (0, _) => String::new(),
            (g, 0) => format!(
                ", and its {:.2} MiB of gradients in that host arena (--offload-gradients)",
                mib(g as f64)
            ),
            (g, peak) => format!(
                ", and its {:.2} MiB of gradients in a host arena of their own beside the \
                 delayed update's (--offload-gradients; peak {:.2} MiB)",
                mib(g as f64),
                mib(peak as f64)
            ),
        };
        s.push_str(&format!(
            "rank {}: {:.2} MiB of its model states (the optimizer's) {home}; host arena \
             peak {:.2} MiB){grads}\n",
            r.rank,
            mib(r.measured.optimizer),
            mib(r.optimizer_offloaded_bytes as f64),
        ));
    }
    for r in reports.iter() {
        let home = match (r.params_offloaded_bytes, r.params_file_bytes) {
            (0, 0) => continue,
            (0, file) => format!(
                "in its file (--offload-params nvme; {:.2} MiB on disk)",
                mib(file as f64)
            ),
            (host, _) => format!(
                "in host memory (--offload-params; host arena peak {:.2} MiB)",
                mib(host as f64)
            ),
        };
        s.push_str(&format!(
            "rank {}: the parameter shards stage 3 gathers {home}\n",
            r.rank
        ));
    }
    for r in reports.iter() {
        let f = r.file_io_per_step;
        if f.read_bytes + f.written_bytes > 0 {
            let rate = |bytes: u64, secs: f64| mib(bytes as f64) / secs.max(1e-9);
            // Bytes copied through a pool buffer are worth a word only when they are many:
            // every piece's last partial block goes that way.
            let pooled = match f.pooled_bytes {
                p if p.saturating_mul(100) < f.read_bytes.saturating_add(f.written_bytes) => {
                    String::new()
                }
                p => format!(
                    "; {:.1} MiB of it copied through a pool buffer (memory off the \
                     alignment direct I/O asks, or pieces' last partial 4 KiB blocks)",
                    mib(p as f64)
                ),
            };
            s.push_str(&format!(
                "rank {}: files per step: read {:.1} MiB in {:.2} s ({:.0} MiB/s), wrote \
                 {:.1} MiB in {:.2} s ({:.0} MiB/s){pooled}\n",
                r.rank,
                mib(f.read_bytes as f64),
                f.read_seconds,
                rate(f.read_bytes, f.read_seconds),
                mib(f.written_bytes as f64),
                f.write_seconds,
                rate(f.written_bytes, f.write_seconds),
            ));
        }
    }
    s
}
