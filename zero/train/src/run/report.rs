//! Rank 0's reporting during a run (progress, `--metrics` lines) and at its end (the
//! summary line and the closing memory table).

use crate::cli::config::TrainConfig;
use crate::error::TrainError;
use crate::run::metrics::{memory_table, step_json, MetricsFile, RankReport, StepMetrics};
use crate::run::progress::Progress;
use crate::run::RunSummary;
use serde_json::{json, Value};
use std::sync::Mutex;

/// Where the reporting rank's lines go; shared by the ranks of this process, written by
/// rank 0 only.
#[derive(Debug)]
pub(crate) struct Reporter {
    metrics: Mutex<Option<MetricsFile>>,
    progress: Progress,
    /// This process hosts rank 0.
    shown: bool,
}

impl Reporter {
    /// Creates the metrics file (if asked for and `shown`) and the progress display.
    ///
    /// # Errors
    /// [`TrainError::Io`] when the metrics file cannot be created.
    pub(crate) fn new(cfg: &TrainConfig, shown: bool) -> Result<Self, TrainError> {
        let metrics = match &cfg.metrics {
            Some(path) if shown => Some(MetricsFile::create(path)?),
            _ => None,
        };
        Ok(Self {
            metrics: Mutex::new(metrics),
            progress: Progress::new(cfg.steps, shown),
            shown,
        })
    }

    fn write(&self, value: &Value) -> Result<(), TrainError> {
        if let Ok(mut guard) = self.metrics.lock() {
            if let Some(m) = guard.as_mut() {
                m.write(value)?;
            }
        }
        Ok(())
    }

    /// A finished optimizer step.
    pub(crate) fn step(&self, m: &StepMetrics) -> Result<(), TrainError> {
        self.progress.step(m);
        self.write(&step_json(m))
    }

    /// A validation loss after `step` steps.
    pub(crate) fn val_loss(&self, step: u64, loss: f32) -> Result<(), TrainError> {
        self.progress
            .line(&format!("step {step} | val loss {loss:.4}"));
        self.write(&json!({"step": step, "val_loss": loss}))
    }

    /// A line for people (saves, the sample).
    pub(crate) fn line(&self, text: &str) {
        self.progress.line(text);
    }

    /// Ends the progress display.
    pub(crate) fn finish_progress(&self) {
        self.progress.finish();
    }

    /// The metrics file's closing summary line and, on stderr, the per-rank memory table.
    ///
    /// # Errors
    /// [`TrainError::Io`] when the metrics file cannot be written.
    pub(crate) fn summary(&self, cfg: &TrainConfig, s: &RunSummary) -> Result<(), TrainError> {
        self.write(&json!({
            "summary": true,
            "num_params": s.num_params,
            "world_size": cfg.world_size,
            "precision": cfg.precision,
            "zero_stage": cfg.zero_stage as u8,
            "steps": s.losses.len(),
            "final_loss": s.losses.last(),
            "ranks": s.ranks.iter().map(RankReport::to_json).collect::<Vec<_>>(),
        }))?;
        if self.shown {
            eprint!("{}", memory_table(&s.ranks));
        }
        Ok(())
    }
}
