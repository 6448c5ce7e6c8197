//! What one rank's arena must hold for a GPT training configuration (the engine's plan plus
//! the model's activations), and, for a cap too small, which stage and options would fit.

use super::bridge::{activation_arena_bytes, gpt_schedule, gpt_units, ActivationPlacement};
use super::error::TrainError;
use zero::{plan_memory, MemoryPlan, PlanShape, Precision, ZeroStage};
use zero_gpt::{GptConfig, ParamLayout};

/// A training configuration as far as one rank's memory depends on it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MemoryQuery {
    /// The model's shape.
    pub model: GptConfig,
    /// Micro-batch size B.
    pub micro_batch: usize,
    /// Sequence length T.
    pub seq_len: usize,
    /// Checkpointing and offload of the activations.
    pub placement: ActivationPlacement,
    /// Everything else the engine's plan depends on (its `activation_bytes` is filled in
    /// from the model's formula).
    pub shape: PlanShape,
}

impl MemoryQuery {
    /// The engine's plan with this configuration's activations.
    ///
    /// # Errors
    /// A batch shape the model refuses, or a plan error (zero ranks, overflow).
    pub fn plan(&self) -> Result<MemoryPlan, TrainError> {
        let activation_bytes =
            activation_arena_bytes(&self.model, self.micro_batch, self.seq_len, self.placement)?;
        let layout = ParamLayout::new(&self.model);
        let schedule = gpt_schedule(&layout, self.placement.checkpoint_every);
        let shape = PlanShape {
            activation_bytes,
            ..self.shape
        };
        Ok(plan_memory(&gpt_units(&layout), &schedule, shape)?)
    }

    /// The same query at `stage` with checkpointing `every` (offload as asked).
    pub fn with(&self, stage: ZeroStage, every: Option<usize>) -> Self {
        Self {
            placement: ActivationPlacement {
                checkpoint_every: every,
                ..self.placement
            },
            shape: PlanShape {
                stage,
                ..self.shape
            },
            ..*self
        }
    }

    /// For a cap `limit` this query exceeds: the lowest stage that fits as asked, and the
    /// lowest that fits with activation checkpointing every block when it is off, or the
    /// bytes the leanest of them needs (then: add ranks, or shorten the batch).
    pub fn what_fits(&self, limit: u64) -> String {
        self.what_fits_or(limit, "add ranks, or lower --micro-batch-size or --seq-len")
    }

    /// [`MemoryQuery::what_fits`], saying `remedy` when nothing fits.
    pub fn what_fits_or(&self, limit: u64, remedy: &str) -> String {
        let mut options = vec![(self.placement.checkpoint_every, "")];
        if self.placement.checkpoint_every.is_none() {
            options.push((Some(1), " with --activation-checkpointing"));
        }
        let mut least = u64::MAX;
        for (every, flags) in options {
            for stage in ZeroStage::ALL {
                let Ok(plan) = self.with(stage, every).plan() else {
                    continue;
                };
                least = least.min(plan.total());
                if plan.total() <= limit {
                    return format!("{stage}{flags} fits ({} bytes)", plan.total());
                }
            }
        }
        format!(
            "nothing fits at this world size and micro-batch (the leanest option needs {least} \
             bytes): {remedy}"
        )
    }
}

/// The default plan knobs of a fp32 run on `world` ranks at `stage` (4 MiB buckets, one unit
/// prefetched, no persistence threshold, and a backend that stages nothing: the local one).
pub fn default_shape(world: usize, stage: ZeroStage, precision: Precision) -> PlanShape {
    PlanShape {
        world,
        stage,
        precision,
        persistence_threshold: 0,
        prefetch_units: 1,
        reduce_bucket_bytes: 4 << 20,
        activation_bytes: 0,
        staging: zero_comm::StagingRule::None,
        offload_optimizer: false,
    }
}

/// Processes a launcher started on this host (torchrun's `LOCAL_WORLD_SIZE`, OpenMPI's
/// `OMPI_COMM_WORLD_LOCAL_SIZE`), read through `var`; `None` when neither is set to a count
/// from 1 to 1024.
pub fn launcher_local_size(var: impl Fn(&str) -> Option<String>) -> Option<usize> {
    ["LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"]
        .into_iter()
        .filter_map(|name| var(name)?.trim().parse::<usize>().ok())
        .find(|n| (1..=crate::validate::MAX_RANKS).contains(n))
}

/// The memory this machine can give without swapping (`MemAvailable` of `/proc/meminfo`),
/// or `None` where that cannot be read (not Linux, a malformed line).
#[must_use]
pub fn host_available_bytes() -> Option<u64> {
    mem_available(&std::fs::read_to_string("/proc/meminfo").ok()?)
}

/// `MemAvailable` of a `/proc/meminfo` text, in bytes.
fn mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?;
    let kib: u64 = line.trim().strip_suffix("kB")?.trim().parse().ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod host_tests {
    use super::mem_available;

    #[test]
    fn the_launchers_local_size_is_read_and_nonsense_ignored() {
        use super::launcher_local_size;
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| (*v).to_string())
            }
        };
        assert_eq!(
            launcher_local_size(env(&[("LOCAL_WORLD_SIZE", "8")])),
            Some(8)
        );
        const OMPI: &[(&str, &str)] = &[("OMPI_COMM_WORLD_LOCAL_SIZE", " 4 ")];
        assert_eq!(launcher_local_size(env(OMPI)), Some(4));
        assert_eq!(launcher_local_size(env(&[("LOCAL_WORLD_SIZE", "0")])), None);
        assert_eq!(
            launcher_local_size(env(&[("LOCAL_WORLD_SIZE", "lots")])),
            None
        );
        assert_eq!(
            launcher_local_size(env(&[("LOCAL_WORLD_SIZE", "99999")])),
            None
        );
        assert_eq!(launcher_local_size(env(&[])), None);
    }

    #[test]
    fn mem_available_reads_the_kib_line_and_refuses_what_it_cannot_read() {
        let text = "MemTotal:       24596396 kB\nMemFree:  100 kB\nMemAvailable:   23000000 kB\n";
        assert_eq!(mem_available(text), Some(23_000_000 * 1024));
        assert_eq!(mem_available("MemTotal: 5 kB\n"), None);
        assert_eq!(mem_available("MemAvailable: lots kB\n"), None);
        assert_eq!(
            mem_available("MemAvailable: 18446744073709551615 kB\n"),
            None
        );
    }
}
