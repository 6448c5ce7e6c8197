//! The ZeRO engine: partitioned optimizer states, gradients and parameters (stages 0-3)
//! around any model that hands it its units and its program.
//!
//! A model registers its units ([`UnitSpec`]: a flat buffer, and where weight decay
//! applies), declares its micro-step once as a [`Program`] of its own operations (each
//! naming the units it reads and whose gradients it writes), and implements [`Model::run`]
//! for one operation. The engine derives from the program when each unit is gathered,
//! prefetched, released and reduced, plans the memory by replaying those calls, and runs
//! them around the model's operations ([`Engine::micro_step`], [`Engine::forward`]);
//! [`Engine::step`] applies the update. The decisions of each stage are the engine's.
//!
//! ```
//! use zero::{Engine, EngineConfig, Model, Op, OpUnits, Program, UnitSpec, ZeroStage};
//!
//! /// One weight vector; the loss is the sum of its elements, so each gradient is 1.
//! struct Sum;
//!
//! impl Model for Sum {
//!     type Op = &'static str;
//!     type Error = zero::Error;
//!
//!     fn run(&mut self, op: &Self::Op, units: &mut OpUnits<'_>) -> Result<(), zero::Error> {
//!         if *op == "backward" {
//!             units.views()?.1[0].fill(1.0);
//!         }
//!         Ok(())
//!     }
//! }
//!
//! let comms = zero_comm::local::create(2)?;
//! std::thread::scope(|s| {
//!     for comm in comms {
//!         s.spawn(move || -> Result<(), zero::Error> {
//!             let ops = vec![
//!                 Op::new("forward").reads([0]),
//!                 Op::new("backward").reads([0]).writes([0]),
//!             ];
//!             let program = Program::new(ops, 1).map_err(zero::Error::BadProgram)?;
//!             let units = vec![UnitSpec::new("weights", 10)];
//!             let config = EngineConfig { stage: ZeroStage::Zero3, ..EngineConfig::default() };
//!             let mut engine =
//!                 Engine::new(comm, units, &[program.schedule()], config, |_, w| w.fill(1.0))?;
//!             // Stage 3: all-gathers the unit, runs both operations, reduce-scatters the
//!             // gradient into this rank's shard and frees the gathered copy.
//!             engine.micro_step(&program, &mut Sum)?;
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
mod declared;
mod delayed;
mod engine;
mod engine_ops;
mod error;
mod export;
mod forward;
mod grad_home;
mod host_io;
mod inflight;
mod kept;
mod kept_partitioned;
pub mod kernels;
mod lending;
mod loss_scale;
mod model;
pub mod optim;
mod optimizer_file;
mod optimizer_home;
mod optimizer_io;
mod optimizer_stream;
mod param_file;
mod param_home;
mod param_read_ahead;
mod planning;
mod precision;
mod run;
mod start;
mod step;
pub mod tensor_parallel;
mod trace;
mod transient;
mod unit_buffers;

pub use collectives::{Collectives, HostCollectives};
pub use engine::{Engine, EngineConfig, UnitViews, DEFAULT_NVME_PREFETCH_BYTES};
pub use engine_ops::EngineOps;
pub use error::{Error, Result};
pub use export::{OwnedStates, StateKind, UnitState};
pub use kernels::{HostKernels, Kernels};
pub use loss_scale::LossScaler;
pub use model::{Model, OpUnits};
pub use optimizer_file::{FileIo, FileTierStats, OPTIMIZER_TIER};
pub use param_file::PARAMS_TIER;
pub use param_home::ParamFileStats;
pub use planning::formulas::{
    comm_elements_per_step, expected_model_state_bytes, padded_model_state_bytes, ModelStateBytes,
};
pub use planning::kept_plan::{KeptInputs, STAGING_SLOTS};
pub use planning::offload_plan::OffloadPlan;
pub use planning::partition;
pub use planning::partition::{Partition, Shard, MAX_RANKS};
pub use planning::plan::{check_fits, plan_memory, MemoryPlan, PlanShape};
pub use planning::policy::{ZeroStage, SHARD_ALIGN_ELEMS};
pub use planning::program::{Op, Program};
pub use planning::schedule::{Call, Schedule};
pub use planning::traffic_plan::{plan_traffic, Traffic};
pub use planning::unit::UnitSpec;
pub use planning::MAX_IN_FLIGHT;
pub use precision::Precision;
pub use step::StepReport;
pub use trace::{chrome_trace, Lane, Sample, Span, Trace};
