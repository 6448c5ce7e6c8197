//! The ZeRO engine: partitioned optimizer states, gradients and parameters (stages 0-3)
//! around any model that hands it its units.
//!
//! A model registers its units ([`UnitSpec`]: a flat buffer, and where weight decay
//! applies) and declares the calls of one micro-step ([`Schedule`]; [`Engine::new`] takes a
//! plain sequential model's, as below); per micro-step it brackets each unit's forward with [`Engine::gather`] /
//! [`Engine::release`] and each unit's backward with [`Engine::begin_backward`] /
//! [`Engine::end_backward`], and per optimizer step calls [`Engine::step`]. The engine
//! decides what each stage keeps and when it communicates.
//!
//! ```
//! use zero::{Engine, EngineConfig, UnitSpec, ZeroStage};
//!
//! let comms = zero_comm::local::create(2)?;
//! std::thread::scope(|s| {
//!     for comm in comms {
//!         s.spawn(move || -> Result<(), zero::Error> {
//!             let units = vec![UnitSpec::new("weights", 10)];
//!             let config = EngineConfig { stage: ZeroStage::Zero3, ..EngineConfig::default() };
//!             let mut engine = Engine::new(comm, units, config, |_, w| w.fill(1.0))?;
//!             engine.gather(0)?; // stage 3: all-gather the unit
//!             let y: f32 = engine.params(0)?.iter().sum(); // a "forward"
//!             engine.release(0)?;
//!             engine.gather(0)?; // backward needs the parameters again
//!             engine.begin_backward(0)?;
//!             let (_, mut grads) = engine.views(&[], &[0])?;
//!             grads[0].fill(y / 10.0); // a "backward"
//!             engine.end_backward(0)?; // reduce-scatter into this rank's shard
//!             engine.release(0)?;
//!             engine.end_micro_step()?;
//!             let report = engine.step(0.1)?;
//!             assert!(report.grad_norm > 0.0);
//!             Ok(())
//!         });
//!     }
//! });
//! # Ok::<(), zero_comm::CommError>(())
//! ```

#![warn(missing_docs)]

mod backward;
pub mod collectives;
mod engine;
mod engine_ops;
mod error;
mod export;
mod formulas;
mod forward;
mod host_io;
mod inflight;
pub mod kernels;
mod lending;
mod loss_scale;
pub mod optim;
mod optimizer_home;
mod order;
pub mod partition;
mod plan;
mod plan_shape;
mod policy;
mod precision;
mod replay;
mod schedule;
mod start;
mod step;
mod traffic_plan;
mod transient;
mod unit;
mod unit_buffers;

pub use collectives::{Collectives, HostCollectives};
pub use engine::{Engine, EngineConfig, Traffic, UnitViews};
pub use engine_ops::EngineOps;
pub use error::{Error, Result};
pub use export::{OwnedStates, StateKind, UnitState};
pub use formulas::{
    comm_elements_per_step, expected_model_state_bytes, padded_model_state_bytes, ModelStateBytes,
};
pub use inflight::MAX_IN_FLIGHT;
pub use kernels::{HostKernels, Kernels};
pub use loss_scale::LossScaler;
pub use optimizer_home::OffloadPlan;
pub use partition::{Partition, Shard, MAX_RANKS};
pub use plan::{check_fits, plan_memory, MemoryPlan, PlanShape};
pub use policy::{ZeroStage, SHARD_ALIGN_ELEMS};
pub use precision::Precision;
pub use schedule::{Schedule, UnitCall};
pub use step::StepReport;
pub use traffic_plan::plan_traffic;
pub use unit::UnitSpec;
