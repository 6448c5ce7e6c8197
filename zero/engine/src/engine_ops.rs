//! Where an engine's model states live and what runs on them: the arena's device, the
//! [`Kernels`] that compute on its blocks and the [`Collectives`] that move them between
//! ranks. The three must agree (a CUDA arena needs kernels and collectives that take device
//! addresses); each refuses blocks it cannot reach with an error.

use zero_alloc::Device;

use crate::collectives::{Collectives, HostCollectives};
use crate::kernels::{HostKernels, Kernels};

/// The device, kernels and collectives of one engine.
#[derive(Debug)]
pub struct EngineOps {
    /// Where the arena is reserved.
    pub device: Device,
    /// Every pass over model-state bytes.
    pub kernels: Box<dyn Kernels>,
    /// Every collective over model states.
    pub collectives: Box<dyn Collectives>,
}

impl EngineOps {
    /// Host memory, host loops, and the engine's communicator.
    pub fn host() -> Self {
        Self {
            device: Device::Cpu,
            kernels: Box::new(HostKernels::default()),
            collectives: Box::new(HostCollectives),
        }
    }
}
