//! `zero-train plan`: what each rank's memory would hold for a run's flags, at every stage,
//! without training. The engine's plan is the step's peak (docs/zero.md, "Memory"), so these
//! are the bytes a run with the same flags allocates, beside the paper's model-state formula.
//!
//! Like DeepSpeed's `estimate_zero*_model_states_mem_needs`, but for the whole arena: model
//! states, the transient unit buffers of one step, the activations and, with
//! `--offload-optimizer`, the host arena of the optimizer states.

use zero::{expected_model_state_bytes, MemoryPlan, Traffic, ZeroStage};
use zero_alloc::human_bytes;
use zero_gpt::{GptConfig, ParamLayout};

use crate::cli::config::{Backend, TrainConfig};
use crate::error::TrainError;
use crate::plan::link_rate::LinkRate;
use crate::plan::memory_fit::MemoryQuery;
use crate::plan::tp_traffic::{tp_traffic_plan, TpTrafficPlan};

/// One stage's plan for a run's flags.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StagePlan {
    /// The stage.
    pub stage: ZeroStage,
    /// The engine's plan for one rank.
    pub plan: MemoryPlan,
    /// The paper's model-state bytes per rank (no padding).
    pub formula: f64,
    /// Elements each rank hands to collectives per optimizer step (the engine's count).
    pub traffic: Traffic,
}

/// The plans of every stage for `cfg`'s model, batch, precision, world size and options
/// (activation checkpointing and offload, buckets, prefetch). The activations are the CPU
/// backend's: a GPU backend adds its kernel scratch.
///
/// # Errors
/// A configuration `zero-train` would refuse, a model file that cannot be read
/// (`--init-from`), or a plan that overflows.
pub fn stage_plans(cfg: &TrainConfig) -> Result<(GptConfig, Vec<StagePlan>), TrainError> {
    let model = cfg.validate()?;
    // A launched run's --world-size is the plan's statement of the launcher's ranks.
    cfg.validate_world()?;
    // Engines run over the data-parallel ranks, each on its rank's part of a split model.
    let ranks = cfg.data_parallel_size();
    let query = MemoryQuery::for_flags(cfg, model, ranks);
    let psi = query.layout().num_params() as u64;
    let every = cfg.activation_placement().checkpoint_every;
    let micro_steps = cfg.grad_accum_steps() as u64;
    let plans = ZeroStage::ALL
        .into_iter()
        .map(|stage| {
            let plan = query.with(stage, every).plan()?;
            let precision = query.shape.precision;
            let formula = expected_model_state_bytes(psi, ranks, stage, precision);
            Ok(StagePlan {
                stage,
                plan,
                formula: formula.total(),
                traffic: query.with(stage, every).traffic(micro_steps)?,
            })
        })
        .collect::<Result<Vec<_>, TrainError>>()?;
    Ok((model, plans))
}

/// The table `zero-train plan` prints: a heading naming what was planned, then one row per
/// stage, the stage asked for marked.
///
/// # Errors
/// As [`stage_plans`].
pub fn plan_table(cfg: &TrainConfig, link: Option<LinkRate>) -> Result<String, TrainError> {
    let (model, plans) = stage_plans(cfg)?;
    let mut out = heading(cfg, &model);
    let limit = cfg.memory_limit.map(|l| l.0);
    let fits_heading = limit.map_or(String::new(), |l| {
        format!(" | fits --memory-limit {}", human_bytes(l))
    });
    out.push_str(&format!(
        "stage | parameters | gradients | optimizer | activations (+ kept inputs) | transient | \
         per rank | host arena/rank | file/rank | formula (model states){fits_heading}\n",
    ));
    let h = |b: f64| human_bytes(b as u64);
    for p in &plans {
        let s = p.plan.model_states;
        let host = p
            .plan
            .offload
            .map_or("-".into(), |o| human_bytes(o.total()));
        let file = match p.plan.offload {
            Some(o) if o.files() > 0 => human_bytes(o.files()),
            _ => "-".into(),
        };
        let mark = if p.stage == cfg.zero_stage {
            " <- asked"
        } else {
            ""
        };
        let fits = match limit {
            Some(l) if p.plan.total() <= l => " | yes".to_string(),
            Some(l) => format!(" | no, {} over", human_bytes(p.plan.total() - l)),
            None => String::new(),
        };
        out.push_str(&format!(
            "{} | {} | {} | {} | {} | {} | {} | {host} | {file} | {}{fits}{mark}\n",
            p.stage as u8,
            h(s.params),
            h(s.grads),
            h(s.optimizer),
            activations_cell(&p.plan),
            human_bytes(p.plan.transient + p.plan.backend_staging),
            human_bytes(p.plan.total()),
            h(p.formula),
        ));
    }
    out.push_str(
        "# per rank: the arena's peak over a step, as a run with these flags allocates it; \
         activations as the CPU backend keeps them (f32), \
         a GPU run adds its kernel scratch\n",
    );
    if let Some(rate) = link {
        out.push_str(&link_table(cfg, &plans, rate));
    }
    if let Some(tp) = tp_traffic_plan(cfg, &model) {
        out.push_str(&tp_line(&tp, link));
    }
    Ok(out)
}

/// Each stage's traffic per optimizer step and its time on a link of `rate` each way: the
/// bytes a rank sends and receives as zero-comm counts them ((N-1)/N of each array each way,
/// twice for an all-reduce), the larger of the two at the rate. A lower bound on the step's
/// communication: latency, protocol headers, the control collectives (loss, norm, overflow
/// flag, a few floats each) and waiting for a slower peer are not in it.
fn link_table(cfg: &TrainConfig, plans: &[StagePlan], rate: LinkRate) -> String {
    let dtype = zero::Precision::from(cfg.precision).dtype();
    let mut out = format!(
        "communication per step at --link-rate {rate} each way, {} micro-step(s) per step:\n\
         stage | traffic/step (elements: RS + AG + 2 x AR) | sent/rank | received/rank | \
         time at the link rate\n",
        cfg.grad_accum_steps(),
    );
    for p in plans {
        let (sent, received) = p.traffic.ring_bytes(cfg.data_parallel_size(), dtype);
        let mark = if p.stage == cfg.zero_stage {
            " <- asked"
        } else {
            ""
        };
        out.push_str(&format!(
            "{} | {} | {} | {} | {:.1} ms{mark}\n",
            p.stage as u8,
            p.traffic.elements(),
            human_bytes(sent),
            human_bytes(received),
            rate.seconds(sent.max(received)) * 1e3,
        ));
    }
    out
}

/// The activations, and the checkpointed block inputs kept beside them (ZeRO-R's
/// checkpointing), which are most of a checkpointed large model's activation memory.
fn activations_cell(plan: &MemoryPlan) -> String {
    match plan.kept_inputs {
        0 => human_bytes(plan.activations),
        kept => format!(
            "{} + {} kept",
            human_bytes(plan.activations),
            human_bytes(kept)
        ),
    }
}

/// The tensor-parallel group's traffic per step, the same at every stage.
fn tp_line(tp: &TpTrafficPlan, link: Option<LinkRate>) -> String {
    let time = link.map_or(String::new(), |rate| {
        format!(
            ", {:.1} ms at --link-rate {rate}",
            rate.seconds(tp.bytes_sent) * 1e3
        )
    });
    format!(
        "tensor-parallel group per step, every stage: {} all-reduces (the model's sums) and \
         {} all-gather of the norm: {} sent and received per rank{time}\n",
        tp.all_reduces,
        tp.all_gathers,
        human_bytes(tp.bytes_sent),
    )
}

fn heading(cfg: &TrainConfig, m: &GptConfig) -> String {
    let params = ParamLayout::new(m).num_params();
    let placement = cfg.activation_placement();
    let checkpointing = match (placement.checkpoint_every, placement.partitions) {
        (Some(k), t) if t > 1 => format!("checkpointing every {k}, inputs partitioned over {t}"),
        (Some(k), _) => format!("checkpointing every {k}"),
        (None, _) => "no checkpointing".into(),
    };
    let optimizer = match cfg.offloads() {
        words if words.is_empty() => "optimizer on the device".to_string(),
        words => words,
    };
    let tp = match cfg.tensor_parallel_size {
        1 => String::new(),
        t => format!(
            " ({} data-parallel x {t} tensor-parallel; the plan is one rank's)",
            cfg.data_parallel_size()
        ),
    };
    let backend = if cfg.backend == Backend::Local {
        ""
    } else {
        " (the launcher's ranks: give --world-size)"
    };
    format!(
        "zero-train plan: L {}, C {}, NH {}, V {}: {:.2}M parameters | {} ranks{backend}{tp} | \
         {} | micro-batch {} x {} | {checkpointing} | {optimizer}\n",
        m.num_layers,
        m.channels,
        m.num_heads,
        m.vocab_size,
        params as f64 / 1e6,
        cfg.world_size,
        format!("{:?}", cfg.precision).to_lowercase(),
        cfg.micro_batch_size,
        cfg.seq_len,
    )
}
