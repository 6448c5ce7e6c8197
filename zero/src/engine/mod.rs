//! The ZeRO engine: how model states are partitioned across data-parallel ranks, and the
//! memory and communication each configuration costs.

pub mod memory;
pub mod partition;

pub use memory::{
    comm_elements_per_step, expected_model_state_bytes, padded_model_state_bytes, ModelStateBytes,
    Precision, ZeroStage,
};
pub use partition::{Partition, PartitionError, Shard};
