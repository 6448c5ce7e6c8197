//! Where an engine's model states live and what runs on them: the arena's device, the
//! [`Kernels`] that compute on its blocks and the [`Collectives`] that move them between
//! ranks. The three must agree (a CUDA arena needs kernels and collectives that take device
//! addresses); each refuses blocks it cannot reach with an error.

use std::path::PathBuf;
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
    /// The folder of the optimizer's file tier (`--nvme-path`), needed with
    /// [`EngineConfig::optimizer_file`](crate::EngineConfig::optimizer_file).
    pub nvme_path: Option<PathBuf>,
}

impl EngineOps {
    /// Host memory, host loops, and the engine's communicator.
    pub fn host() -> Self {
        Self {
            device: Device::Cpu,
            kernels: Box::new(HostKernels::default()),
            collectives: Box::new(HostCollectives),
            nvme_path: None,
        }
    }

    /// These ops with the optimizer's file tier in `dir`.
    #[must_use]
    pub fn with_nvme_path(self, dir: Option<PathBuf>) -> Self {
        Self {
            nvme_path: dir,
            ..self
        }
    }
}
