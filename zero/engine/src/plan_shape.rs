//! An engine configuration read as the shape of its memory plan: the one mapping from the
//! knobs to the plan, for planners that size a run without building an engine (a trainer's
//! start-up check, `zero-train plan`).

use crate::engine::EngineConfig;
use crate::plan::PlanShape;
use zero_comm::StagingRule;

impl EngineConfig {
    /// What the memory plan of an engine with this configuration depends on, on `world`
    /// ranks whose collectives stage as `staging` says.
    #[must_use]
    pub fn plan_shape(&self, world: usize, staging: StagingRule) -> PlanShape {
        PlanShape {
            world,
            stage: self.stage,
            precision: self.precision,
            persistence_threshold: self.persistence_threshold,
            prefetch_units: self.prefetch_units,
            reduce_bucket_bytes: self.reduce_bucket_bytes,
            activation_bytes: self.activation_bytes,
            staging,
            offload_optimizer: self.offload_optimizer,
        }
    }
}
