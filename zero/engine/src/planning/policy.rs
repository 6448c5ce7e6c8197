//! What a ZeRO stage means for one unit, decided in one place.
//!
//! Every other module asks a unit's [`UnitPolicy`] instead of testing the stage: which
//! collective reduces its gradients, which of its buffers stay whole on every rank and which
//! keep only this rank's shard, which range this rank updates, and whether the model reads a
//! gathered copy. A new stage variant or storage tier changes [`UnitPolicy::new`] and the
//! methods below, not the engine's passes.
//!
//! | stage | parameters | gradients | optimizer states | gradient reduction |
//! |---|---|---|---|---|
//! | 0 | whole | whole | whole | all-reduce |
//! | 1 | whole | whole (only the own shard is reduced) | shard | reduce-scatter |
//! | 2 | whole | shard | shard | reduce-scatter |
//! | 3 | shard (whole under the persistence threshold) | shard | shard | reduce-scatter |

use super::partition::{Partition, Shard};
use super::unit::UnitSpec;
use crate::error::Result;
use crate::precision::Precision;
use std::fmt;
use std::ops::Range;

/// Shards are multiples of 128 elements: 256 bytes (the arena's alignment) for 2-byte
/// storage and 512 for f32, so every shard of every kind starts on an aligned boundary and
/// no block wastes rounding.
pub const SHARD_ALIGN_ELEMS: usize = 128;

/// Which model states are partitioned across the data-parallel ranks (DeepSpeed's `stage`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ZeroStage {
    /// Plain data parallelism: everything replicated.
    Zero0 = 0,
    /// P_os: optimizer states partitioned.
    Zero1 = 1,
    /// P_os+g: optimizer states and gradients partitioned.
    Zero2 = 2,
    /// P_os+g+p: optimizer states, gradients and parameters partitioned.
    Zero3 = 3,
}

impl ZeroStage {
    /// All stages, in order.
    pub const ALL: [ZeroStage; 4] = [Self::Zero0, Self::Zero1, Self::Zero2, Self::Zero3];

    /// The stage numbered `n` (0..=3).
    pub fn from_index(n: u8) -> Option<Self> {
        Self::ALL.get(usize::from(n)).copied()
    }

    pub(crate) fn optimizer_partitioned(self) -> bool {
        self >= Self::Zero1
    }

    pub(crate) fn gradients_partitioned(self) -> bool {
        self >= Self::Zero2
    }

    pub(crate) fn parameters_partitioned(self) -> bool {
        self >= Self::Zero3
    }
}

impl fmt::Display for ZeroStage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "stage {}", *self as u8)
    }
}

/// The collective that reduces a unit's gradient buckets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GradReduce {
    /// Every rank gets every reduced segment (stage 0).
    AllReduce,
    /// Every rank gets only its own segment (stages 1-3).
    ReduceScatter,
}

/// How one unit is kept and updated on this rank.
#[derive(Debug, Clone, Copy)]
pub(crate) struct UnitPolicy {
    pub part: Partition,
    /// Parameters kept whole on every rank: stages 0-2, and units under the persistence
    /// threshold at stage 3.
    pub whole_params: bool,
    /// Gradients accumulated whole (stages 0-1) rather than as one shard.
    pub whole_grads: bool,
    /// Optimizer states whole (stage 0) rather than as one shard.
    pub whole_optim: bool,
    /// The collective that reduces the gradients.
    pub reduce: GradReduce,
    /// The model reads the stored parameters directly (whole f32), with no compute copy.
    pub reads_stored: bool,
}

impl UnitPolicy {
    /// The policy of `spec` at `stage` over `world` ranks.
    ///
    /// # Errors
    /// A partition error (zero ranks, overflow).
    pub fn new(
        spec: &UnitSpec,
        world: usize,
        stage: ZeroStage,
        precision: Precision,
        persistence_threshold: usize,
    ) -> Result<Self> {
        let part = Partition::new(spec.numel, world, SHARD_ALIGN_ELEMS)?;
        let persistent = spec.numel < persistence_threshold;
        Ok(Self::with_partition(part, stage, precision, persistent))
    }

    /// The policy of a unit split as `part`; `persistent` units keep whole parameters at
    /// every stage.
    pub fn with_partition(
        part: Partition,
        stage: ZeroStage,
        precision: Precision,
        persistent: bool,
    ) -> Self {
        let whole_params = !stage.parameters_partitioned() || persistent;
        Self {
            part,
            whole_params,
            whole_grads: !stage.gradients_partitioned(),
            whole_optim: !stage.optimizer_partitioned(),
            reduce: if stage.optimizer_partitioned() {
                GradReduce::ReduceScatter
            } else {
                GradReduce::AllReduce
            },
            reads_stored: whole_params && !precision.has_master(),
        }
    }

    /// Elements of a buffer kept whole (`true`) or as this rank's shard.
    pub fn len(&self, whole: bool) -> usize {
        if whole {
            self.part.padded_numel()
        } else {
            self.part.shard_len()
        }
    }

    /// Parameters are sharded and must be all-gathered before use (and can be prefetched).
    pub fn gathered(&self) -> bool {
        !self.whole_params
    }

    /// The elements of the unit `rank` updates: all of them where optimizer states are
    /// whole, else its shard's real elements.
    pub fn owned(&self, rank: usize) -> Shard {
        if self.whole_optim {
            Shard {
                offset: 0,
                len: self.part.numel(),
            }
        } else {
            self.part.data_shard(rank)
        }
    }

    /// After the step, whole parameters updated shard by shard are all-gathered back in
    /// sync (stages 1-2, persistent units at stage 3).
    pub fn syncs_params_after_step(&self) -> bool {
        self.whole_params && !self.whole_optim
    }

    /// The segments of a reduced gradient bucket that `rank` accumulates: every rank's at
    /// all-reduce, its own at reduce-scatter.
    pub fn kept_segments(&self, rank: usize) -> Range<usize> {
        match self.reduce {
            GradReduce::AllReduce => 0..self.part.world(),
            GradReduce::ReduceScatter => rank..rank + 1,
        }
    }

    /// Where element `offset` of segment `segment`'s shard lies in the accumulated gradient
    /// of `rank` (whole, or its shard only).
    pub fn grad_index(&self, rank: usize, segment: usize, offset: usize) -> usize {
        let at = self.part.shard(segment).offset + offset;
        if self.whole_grads {
            at
        } else {
            at - self.part.shard(rank).offset
        }
    }

    /// True when this rank holds every rank's reduced gradient shard, so the global norm
    /// needs no exchange of partial sums.
    pub fn holds_every_reduced_shard(&self) -> bool {
        self.reduce == GradReduce::AllReduce
    }
}
