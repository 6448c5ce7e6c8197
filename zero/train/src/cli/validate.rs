//! The range of every value of a [`TrainConfig`], checked before the ranks start, so that
//! arithmetic on the values cannot overflow and no count is absurd.
//!
//! Each refusal is a [`ConfigError::OutOfRange`] naming the flag (and its config key), the
//! value given and what would be right; a feature that does not run at
//! `--tensor-parallel-size` above 1 yet is a [`ConfigError::Invalid`] naming both flags.

use crate::cli::config::{Backend, TrainConfig};
use crate::error::ConfigError;
use std::fmt::Display;
use zero_gpt::{GptConfig, ParamLayout, TpSplit};

/// Most ranks one run starts.
pub use zero::MAX_RANKS;
/// Most optimizer steps (and warm-up, evaluation and save intervals) a run counts.
pub const MAX_STEPS: u64 = 1 << 40;
/// Most tokens in one global batch (`batch_size * seq_len`): 1 GiB of u32 token ids.
pub const MAX_BATCH_TOKENS: usize = 1 << 28;
/// Most layers or heads of a model (the model's own bound, which its files obey too).
pub const MAX_LAYERS_OR_HEADS: usize = zero_gpt::MAX_LAYERS_OR_HEADS;
/// Most channels, vocabulary entries, sequence positions, sampled tokens, top-k or
/// validation batches.
pub const MAX_WIDTH: usize = 1 << 20;
/// Largest gradient bucket.
pub const MAX_BUCKET_BYTES: u64 = 1 << 40;
/// Longest wait for peers, in seconds (a week).
pub const MAX_COMM_TIMEOUT_S: u64 = 7 * 24 * 3600;

/// `Err` naming `key` unless `lo <= value <= hi`.
fn in_range<T: PartialOrd + Display>(
    key: &'static str,
    value: T,
    lo: T,
    hi: T,
) -> Result<(), ConfigError> {
    if lo <= value && value <= hi {
        Ok(())
    } else {
        Err(out_of_range(key, &value, format!("expected {lo} to {hi}")))
    }
}

fn out_of_range(key: &'static str, value: &dyn Display, expected: String) -> ConfigError {
    ConfigError::OutOfRange {
        key,
        value: value.to_string(),
        expected,
    }
}

/// `Err` naming `key` unless `value` is a finite number in `lo..=hi`.
fn finite_in(key: &'static str, value: f32, lo: f32, hi: f32) -> Result<(), ConfigError> {
    if value.is_finite() && lo <= value && value <= hi {
        Ok(())
    } else {
        Err(out_of_range(
            key,
            &value,
            match (lo == f32::MIN_POSITIVE, hi == f32::MAX) {
                (true, true) => "expected a finite number greater than 0".to_string(),
                (true, false) => format!("expected a number greater than 0, at most {}", short(hi)),
                (false, true) => format!("expected a finite number of at least {}", short(lo)),
                (false, false) => format!("expected a number from {} to {}", short(lo), short(hi)),
            },
        ))
    }
}

/// `x` as a person reads it: plain for ordinary magnitudes, scientific (`1.2e-38`) for
/// extreme ones such as `f32::MIN_POSITIVE`.
fn short(x: f32) -> String {
    if x == 0.0 || (1e-4..1e6).contains(&x.abs()) {
        x.to_string()
    } else {
        format!("{x:e}")
    }
}

impl TrainConfig {
    /// Checks every value's range and the relations between values (under a launcher all but
    /// [`validate_world`](Self::validate_world), which needs the joined world size), and
    /// returns the model the configuration asks for: the one place it is resolved (an
    /// `--init-from` file is read here), for the caller to carry.
    ///
    /// # Errors
    /// [`ConfigError::OutOfRange`] naming the flag, the value and what would be right;
    /// [`ConfigError::Model`] for an unknown preset or an invalid model shape; the errors of
    /// an `--init-from` file.
    pub fn validate(&self) -> Result<GptConfig, ConfigError> {
        // Before the shape, which reads an `--init-from` file.
        self.refuse_at_tensor_parallel()?;
        let model = self.validate_shape()?;
        self.validate_batch()?;
        self.validate_schedule()?;
        self.validate_engine(&model)?;
        self.validate_offload()?;
        Ok(model)
    }

    fn validate_shape(&self) -> Result<GptConfig, ConfigError> {
        let optional = [
            ("layers", self.layers, MAX_LAYERS_OR_HEADS),
            ("heads", self.heads, MAX_LAYERS_OR_HEADS),
            ("dim", self.dim, MAX_WIDTH),
            ("vocab", self.vocab, MAX_WIDTH),
        ];
        for (key, value, hi) in optional {
            if let Some(v) = value {
                in_range(key, v, 1, hi)?;
            }
        }
        in_range("seq_len", self.seq_len, 1, MAX_WIDTH)?;
        in_range("sample_tokens", self.sample_tokens, 0, MAX_WIDTH)?;
        if self.sample_tokens > 0 {
            in_range("top_k", self.top_k, 1, MAX_WIDTH)?;
        }
        self.model_config()
    }

    /// The communicators' settings: `comm_timeout` checked (a launcher's ranks build their
    /// communicator before the rest of the configuration is validated).
    ///
    /// # Errors
    /// [`ConfigError::OutOfRange`] naming `comm_timeout`.
    pub fn comm_config(&self) -> Result<zero_comm::Config, ConfigError> {
        in_range("comm_timeout", self.comm_timeout, 1, MAX_COMM_TIMEOUT_S)?;
        Ok(zero_comm::Config {
            checksums: self.comm_checksums,
            ..zero_comm::Config::with_timeout(std::time::Duration::from_secs(self.comm_timeout))
        })
    }

    fn validate_batch(&self) -> Result<(), ConfigError> {
        // A launcher's ranks learn the world size once joined; `run_group` checks it then.
        if self.backend == crate::cli::config::Backend::Local {
            self.validate_world()?;
        } else {
            self.validate_batch_sizes()?;
        }
        self.comm_config()?;
        if self.eval_every > 0 {
            in_range("eval_batches", self.eval_batches, 1, MAX_WIDTH)?;
        }
        Ok(())
    }

    /// Checks the world size and that the global batch divides into its ranks: with the
    /// local backend as part of [`validate`](Self::validate), under a launcher once the ranks
    /// have joined and `world_size` is the launcher's.
    ///
    /// # Errors
    /// [`ConfigError::OutOfRange`] naming `world_size`, `micro_batch_size` or `batch_size`.
    pub fn validate_world(&self) -> Result<(), ConfigError> {
        in_range("world_size", self.world_size, 1, MAX_RANKS)?;
        self.validate_tensor_parallel_world()?;
        self.validate_batch_sizes()?;
        let ranks = self.data_parallel_size();
        let ranks_name = match self.tensor_parallel_size {
            1 => format!("world_size {ranks}"),
            t => format!("the data-parallel ranks {ranks} (world_size / tensor_parallel_size {t})"),
        };
        let Some(per_micro_step) = self.micro_batch_size.checked_mul(ranks) else {
            return Err(out_of_range(
                "micro_batch_size",
                &self.micro_batch_size,
                format!("micro_batch_size x {ranks_name} overflows"),
            ));
        };
        if self.batch_size % per_micro_step != 0 {
            return Err(out_of_range(
                "batch_size",
                &self.batch_size,
                format!(
                    "batch_size {} is not a multiple of micro_batch_size {} x {ranks_name} = \
                     {per_micro_step} (change --batch-size to a multiple of {per_micro_step}, or \
                     --micro-batch-size)",
                    self.batch_size, self.micro_batch_size
                ),
            ));
        }
        let tokens = self.batch_size.checked_mul(self.seq_len);
        if tokens.is_none_or(|t| t > MAX_BATCH_TOKENS) {
            return Err(out_of_range(
                "batch_size",
                &self.batch_size,
                format!("batch_size x seq_len must be at most {MAX_BATCH_TOKENS} tokens"),
            ));
        }
        Ok(())
    }

    /// The tensor-parallel size against the world: at least 1 and dividing the world size
    /// (every group whole), naming a size that would.
    fn validate_tensor_parallel_world(&self) -> Result<(), ConfigError> {
        let (t, world) = (self.tensor_parallel_size, self.world_size);
        in_range("tensor_parallel_size", t, 1, MAX_RANKS)?;
        if world % t == 0 {
            return Ok(());
        }
        let fits = (1..=t.min(world))
            .rev()
            .find(|d| world % d == 0)
            .unwrap_or(1);
        Err(out_of_range(
            "tensor_parallel_size",
            &t,
            format!(
                "a divisor of the {world} ranks (--world-size, or the launcher's), so every \
                 tensor-parallel group is whole: e.g. {fits}"
            ),
        ))
    }

    /// At T > 1: T divides the model's heads and its padded vocabulary (zero-gpt's
    /// [`TpSplit::validate_vocab`]: the vocabulary is split too).
    fn validate_tensor_parallel(&self, model: &GptConfig) -> Result<(), ConfigError> {
        let t = self.tensor_parallel_size;
        if t <= 1 || (TpSplit { size: t, rank: 0 }).validate_vocab(model).is_ok() {
            return Ok(());
        }
        let (heads, vp) = (model.num_heads, model.padded_vocab_size);
        let fits = (1..=t.min(heads))
            .rev()
            .find(|d| heads % d == 0 && vp % d == 0)
            .unwrap_or(1);
        Err(out_of_range(
            "tensor_parallel_size",
            &t,
            format!(
                "a divisor of the model's {heads} heads (--heads) and of its vocabulary padded \
                 to {vp}, so each rank holds whole heads and an equal part of the vocabulary: \
                 e.g. {fits}"
            ),
        ))
    }

    /// `--partition-activations` partitions the inputs that checkpointing keeps over a
    /// tensor-parallel group: it needs both.
    fn validate_partition_activations(&self) -> Result<(), ConfigError> {
        if !self.partition_activations {
            return Ok(());
        }
        let why = if !self.activation_checkpointing {
            "partitions the block inputs that --activation-checkpointing keeps: give both"
        } else if self.tensor_parallel_size <= 1 {
            "partitions each kept block input over a tensor-parallel group, and \
             --tensor-parallel-size 1 has none: give --tensor-parallel-size 2 or more (a \
             divisor of --world-size, --heads and the padded vocabulary), or leave \
             --partition-activations out"
        } else {
            return Ok(());
        };
        Err(ConfigError::Invalid(format!(
            "--partition-activations (`partition_activations` in --config) {why}"
        )))
    }

    /// At T > 1, refuses every feature that does not run split yet, naming it.
    fn refuse_at_tensor_parallel(&self) -> Result<(), ConfigError> {
        let t = self.tensor_parallel_size;
        if t <= 1 {
            return Ok(());
        }
        let refused = [
            (self.device.is_cuda(), "--device cuda (CPU only)"),
            (self.backend == Backend::Nccl, "--backend nccl (CPU only)"),
            (self.offload_optimizer.is_on(), "--offload-optimizer"),
            (!self.inject_fault.is_empty(), "--inject-fault"),
            (self.fingerprint_every > 0, "--fingerprint-every"),
        ];
        match refused.iter().find(|(asked, _)| *asked) {
            Some((_, what)) => Err(ConfigError::Invalid(format!(
                "{what} does not run with --tensor-parallel-size {t} (`tensor_parallel_size` \
                 in --config) yet: leave it out, or use --tensor-parallel-size 1"
            ))),
            None => Ok(()),
        }
    }

    /// Every `--inject-fault` names a step the run takes, and those of launcher attempt
    /// `attempt` a rank of the world: a fault that can never fire is a typo. (A fault of
    /// another attempt may name a rank that a shrunk world no longer has.)
    ///
    /// # Errors
    /// [`ConfigError::OutOfRange`] naming the spec.
    pub fn validate_faults(&self, attempt: u64) -> Result<(), ConfigError> {
        for spec in &self.inject_fault {
            let rank_ok = spec.attempt != attempt || spec.rank < self.world_size;
            if !rank_ok || spec.step >= self.steps {
                return Err(out_of_range(
                    "inject_fault",
                    spec,
                    format!(
                        "rank below the world size {} and step below --steps {}",
                        self.world_size, self.steps
                    ),
                ));
            }
        }
        Ok(())
    }

    fn validate_batch_sizes(&self) -> Result<(), ConfigError> {
        in_range(
            "micro_batch_size",
            self.micro_batch_size,
            1,
            MAX_BATCH_TOKENS,
        )?;
        in_range("batch_size", self.batch_size, 1, MAX_BATCH_TOKENS)
    }

    fn validate_schedule(&self) -> Result<(), ConfigError> {
        for (key, value) in [
            ("steps", self.steps),
            ("warmup_steps", self.warmup_steps),
            ("eval_every", self.eval_every),
            ("save_every", self.save_every),
            ("fingerprint_every", self.fingerprint_every),
        ] {
            in_range(key, value, 0, MAX_STEPS)?;
        }
        in_range("trace_steps", self.trace_steps, 1, MAX_STEPS)?;
        // At stage 3 no rank holds the parameters whole: gathered first, every rank's
        // fingerprint would hash the same values and check nothing.
        if self.fingerprint_every > 0 && self.zero_stage == zero::ZeroStage::Zero3 {
            return Err(out_of_range(
                "fingerprint_every",
                &self.fingerprint_every,
                "0 at --zero-stage 3: fingerprints compare parameters every rank holds whole, \
                 which no rank does at stage 3"
                    .into(),
            ));
        }
        self.validate_reals()
    }

    /// Checks the real-valued fields alone: run on each layer before they are merged, as
    /// the merge goes through JSON, which has no NaN or infinity.
    pub(crate) fn validate_reals(&self) -> Result<(), ConfigError> {
        finite_in("lr", self.lr, f32::MIN_POSITIVE, f32::MAX)?;
        finite_in("min_lr_ratio", self.min_lr_ratio, 0.0, 1.0)?;
        finite_in("weight_decay", self.weight_decay, 0.0, f32::MAX)?;
        finite_in("grad_clip", self.grad_clip, 0.0, f32::MAX)
    }

    fn validate_engine(&self, model: &GptConfig) -> Result<(), ConfigError> {
        self.validate_tensor_parallel(model)?;
        in_range(
            "reduce_bucket_size",
            self.reduce_bucket_size.0,
            1,
            MAX_BUCKET_BYTES,
        )?;
        if let Some(limit) = self.memory_limit {
            in_range("memory_limit", limit.0, 1, u64::MAX)?;
        }
        if let Err(e) = zero_alloc::host_memory_override() {
            let var = zero_alloc::HOST_MEMORY_VAR;
            return Err(ConfigError::Invalid(format!(
                "{var}: {e}; it states the host memory in place of MemAvailable, or unset it"
            )));
        }
        if self.offload_activations && !self.activation_checkpointing {
            return Err(ConfigError::Invalid(
                "--offload-activations offloads the inputs that --activation-checkpointing \
                 keeps: give both"
                    .into(),
            ));
        }
        self.validate_partition_activations()?;
        // A segment longer than the model is the whole model: a larger K is a typo.
        in_range(
            "checkpoint_every",
            self.checkpoint_every,
            1,
            model.num_layers,
        )?;
        let units = ParamLayout::new(model).num_units();
        in_range("prefetch_units", self.prefetch_units, 0, units)
    }
}
