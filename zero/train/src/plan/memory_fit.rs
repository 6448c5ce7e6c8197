//! What one rank's arena must hold for a GPT training configuration (the engine's plan plus
//! the model's activations), and, for a cap too small, which stage and options would fit.

use crate::bridge::{
    activation_arena_bytes, gpt_units, kept_inputs, model_activation_arena_bytes, split_layout,
    ActivationPlacement, GptPrograms, TpPrograms,
};
use crate::cli::config::TrainConfig;
use crate::error::TrainError;
use zero::{
    plan_memory, plan_traffic, EngineConfig, MemoryPlan, PlanShape, Precision, Schedule, Traffic,
    ZeroStage,
};
use zero_gpt::{Gpt, GptConfig, ParamLayout, TpSplit};

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
    /// Everything else the engine's plan depends on (its `activation_bytes` and
    /// `kept_inputs` are filled in from the model's formulas); its ranks are the
    /// data-parallel ones, which the engine runs over.
    pub shape: PlanShape,
    /// Ranks per tensor-parallel group, T (1: the blocks whole): the plan is then one
    /// rank's, of its split layout ([`ParamLayout::split`]), programs and activations.
    pub tensor_parallel: usize,
}

impl MemoryQuery {
    /// The query of a run configured by `cfg`, building `model` with its activations placed
    /// as `placement` says, whose engine plans as `shape` says (its
    /// [`EngineConfig::plan_shape`](zero::EngineConfig::plan_shape)), on `cfg`'s device (a
    /// GPU's arena lands offloaded gradients through a host block): for the trainer's
    /// start-up check and `zero-train plan`.
    pub fn for_run(
        cfg: &TrainConfig,
        model: GptConfig,
        placement: ActivationPlacement,
        shape: PlanShape,
    ) -> Self {
        Self {
            model,
            micro_batch: cfg.micro_batch_size,
            seq_len: cfg.seq_len,
            placement,
            shape: PlanShape {
                device_arena: cfg.device.is_cuda(),
                ..shape
            },
            tensor_parallel: cfg.tensor_parallel_size,
        }
    }

    /// The query of `cfg`'s run on `world` ranks of a backend that stages nothing (the local
    /// one), its activations placed as the flags say.
    pub fn for_flags(cfg: &TrainConfig, model: GptConfig, world: usize) -> Self {
        let shape = cfg
            .engine_config(0, zero::KeptInputs::default())
            .plan_shape(world, zero_comm::StagingRule::None);
        Self::for_run(cfg, model, cfg.activation_placement(), shape)
    }

    /// The engine's plan with this configuration's activations.
    ///
    /// # Errors
    /// A batch shape the model refuses, or a plan error (zero ranks, overflow).
    pub fn plan(&self) -> Result<MemoryPlan, TrainError> {
        let (m, b, t, placed) = (&self.model, self.micro_batch, self.seq_len, self.placement);
        let layout = self.layout();
        let activation_bytes = match self.tensor_parallel {
            0 | 1 => activation_arena_bytes(m, b, t, placed)?,
            tp => {
                let split = TpSplit { size: tp, rank: 0 };
                let model = Gpt::with_vocab_parallel(*m, split)?;
                model_activation_arena_bytes(&model, b, t, placed)?
            }
        };
        let shape = PlanShape {
            activation_bytes,
            kept_inputs: kept_inputs(m, b, t, placed)?,
            ..self.shape
        };
        let schedules = self.schedules(&layout)?;
        Ok(plan_memory(
            &gpt_units(&layout),
            &schedules.iter().collect::<Vec<_>>(),
            shape,
        )?)
    }

    /// One rank's layout: the model's, split over T ranks at T > 1 with its vocabulary
    /// (every rank of a group holds as many parameters).
    pub fn layout(&self) -> ParamLayout {
        split_layout(&self.model, self.tensor_parallel)
    }

    /// The programs' calls of `layout`, as the engine is declared them, training first.
    fn schedules(&self, layout: &ParamLayout) -> Result<Vec<Schedule>, TrainError> {
        let every = self.placement.checkpoint_every;
        Ok(if layout.tensor_parallel() > 1 {
            let p = TpPrograms::new(layout, every)?;
            p.schedules().into_iter().cloned().collect()
        } else {
            let p = GptPrograms::new(layout, every)?;
            p.schedules().into_iter().cloned().collect()
        })
    }

    /// Elements each rank hands to collectives over one optimizer step of `micro_steps`
    /// micro-steps: the engine's own count ([`zero::Engine::traffic`]) replayed from the
    /// GPT's training program, without running it.
    ///
    /// # Errors
    /// A plan error (zero ranks, overflow).
    pub fn traffic(&self, micro_steps: u64) -> Result<Traffic, TrainError> {
        let layout = self.layout();
        let schedules = self.schedules(&layout)?;
        Ok(plan_traffic(
            &gpt_units(&layout),
            &schedules[0],
            self.shape,
            micro_steps,
        )?)
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

    /// The same query with the optimizer states offloaded to the host, or not.
    pub fn with_offload(&self, offload_optimizer: bool) -> Self {
        Self {
            shape: PlanShape {
                offload_optimizer,
                ..self.shape
            },
            ..*self
        }
    }

    /// For a cap `limit` on the arena that this query exceeds: the lowest stage that fits as
    /// asked, else with activation checkpointing every block, else with the optimizer
    /// offloaded, else with both (the options not already asked for), or the bytes the leanest
    /// of them needs (then: add ranks, or shorten the batch).
    pub fn what_fits(&self, limit: u64) -> String {
        self.what_fits_or(
            limit,
            "add ranks, or lower --micro-batch-size or --seq-len",
            false,
        )
    }

    /// [`MemoryQuery::what_fits`] for a `limit` that the offloaded optimizer's host arena
    /// draws on too when `host_counts` (a CPU run's machine memory), so offloading is then
    /// no option and an offloaded plan counts its host arena; saying `remedy` when nothing
    /// fits. Offloading is no option under tensor parallelism either (refused there).
    pub fn what_fits_or(&self, limit: u64, remedy: &str, host_counts: bool) -> String {
        let (asked_every, asked_offload) = (
            self.placement.checkpoint_every,
            self.shape.offload_optimizer,
        );
        let mut options = vec![(asked_every, asked_offload)];
        if asked_every.is_none() {
            options.push((Some(1), asked_offload));
        }
        if !asked_offload && !host_counts && self.tensor_parallel == 1 {
            options.push((asked_every, true));
            if asked_every.is_none() {
                options.push((Some(1), true));
            }
        }
        let mut least = u64::MAX;
        for (every, offload) in options {
            let flags = added_flags(every != asked_every, offload != asked_offload);
            for stage in ZeroStage::ALL {
                let Ok(plan) = self.with(stage, every).with_offload(offload).plan() else {
                    continue;
                };
                let host = plan.offload.map_or(0, |o| o.total());
                let need = plan
                    .total()
                    .saturating_add(if host_counts { host } else { 0 });
                least = least.min(need);
                if need <= limit {
                    return format!("{stage}{flags} fits ({need} bytes)");
                }
            }
        }
        format!(
            "nothing fits at this world size and micro-batch (the leanest option needs {least} \
             bytes): {remedy}"
        )
    }
}

/// The words naming the options a hint adds to what was asked.
fn added_flags(checkpointing: bool, offload: bool) -> &'static str {
    match (checkpointing, offload) {
        (false, false) => "",
        (true, false) => " with --activation-checkpointing",
        (false, true) => " with --offload-optimizer",
        (true, true) => " with --activation-checkpointing and --offload-optimizer",
    }
}

/// The plan knobs of an engine's defaults at `stage` and `precision` on `world` ranks (4 MiB
/// buckets, one unit prefetched, no persistence threshold), with a backend that stages
/// nothing: the local one.
pub fn default_shape(world: usize, stage: ZeroStage, precision: Precision) -> PlanShape {
    let engine = EngineConfig {
        stage,
        precision,
        ..EngineConfig::default()
    };
    engine.plan_shape(world, zero_comm::StagingRule::None)
}

/// Processes a launcher started on this host (torchrun's `LOCAL_WORLD_SIZE`, OpenMPI's
/// `OMPI_COMM_WORLD_LOCAL_SIZE`), read through `var`; `None` when neither is set to a count
/// from 1 to [`zero::MAX_RANKS`].
pub fn launcher_local_size(var: impl Fn(&str) -> Option<String>) -> Option<usize> {
    ["LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"]
        .into_iter()
        .filter_map(|name| var(name)?.trim().parse::<usize>().ok())
        .find(|n| (1..=zero::MAX_RANKS).contains(n))
}

#[cfg(test)]
mod host_tests {
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
}
