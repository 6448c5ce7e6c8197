//! The planning layer: what a configuration keeps, moves and allocates, computed from the
//! units, the programs and the knobs alone, with no memory and no communication. It imports
//! nothing of the runtime (the engine, its buffers, kernels and collectives), which imports
//! it: one source of truth for the stage's rules, the partition, the derived calls and the
//! plan the arena is sized by.

pub(crate) mod formulas;
pub(crate) mod kept_plan;
pub(crate) mod offload_plan;
pub mod partition;
pub(crate) mod plan;
pub(crate) mod policy;
pub(crate) mod program;
pub(crate) mod replay;
pub(crate) mod schedule;
pub(crate) mod traffic_plan;
pub(crate) mod unit;

pub use replay::MAX_IN_FLIGHT;
