//! NVRTC compilation of the kernel sources, and the per-device cache of loaded kernels.
//!
//! Every source is compiled once per device (for the device's own architecture) the first
//! time a backend on that device starts; later backends on the same device share the loaded
//! functions. Rejected: compiling each kernel on first launch, which would put a compiler
//! run (tens of milliseconds) inside the first training step.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, CudaFunction};
use cudarc::nvrtc::{self, CompileError, CompileOptions, Ptx};

use super::probe::Library;
use super::sources::{KernelSource, NVRTC_OPTIONS, SOURCES};
use crate::{GptError, Result};

/// Compiles `source` (with the common prelude) to PTX for `arch` (`None`: NVRTC's default).
///
/// # Errors
/// [`GptError::CudaUnavailable`] when NVRTC is missing; [`GptError::Nvrtc`] with the
/// compiler's log when the source does not compile.
pub fn compile(source: &KernelSource, arch: Option<&'static str>) -> Result<Ptx> {
    Library::Nvrtc.require()?;
    let opts = CompileOptions {
        arch,
        options: NVRTC_OPTIONS.iter().map(|s| (*s).to_string()).collect(),
        name: Some(source.name.to_string()),
        ..CompileOptions::default()
    };
    nvrtc::compile_ptx_with_opts(source.program(), opts).map_err(|e| GptError::Nvrtc {
        source_name: source.name,
        arch: arch.unwrap_or("default"),
        log: match e {
            CompileError::CompileError { log, .. } => log.to_string_lossy().into_owned(),
            other => format!("{other:?}"),
        },
    })
}

/// The `sm_XY` name NVRTC takes for compute capability (major, minor), among those this
/// crate knows; `None` (NVRTC's default target, JIT-compiled by the driver) otherwise.
#[must_use]
pub fn arch_for(major: i32, minor: i32) -> Option<&'static str> {
    Some(match (major, minor) {
        (7, 5) => "sm_75",
        (8, 0) => "sm_80",
        (8, 6) => "sm_86",
        (8, 9) => "sm_89",
        (9, 0) => "sm_90",
        (10, 0) => "sm_100",
        (12, 0) => "sm_120",
        _ => return None,
    })
}

fn driver_err(op: &'static str) -> impl Fn(cudarc::driver::DriverError) -> GptError {
    move |e| GptError::Cuda {
        op,
        message: format!("{e:?}"),
    }
}

/// Every kernel function, loaded on one device.
#[derive(Debug)]
pub struct KernelRegistry {
    functions: HashMap<&'static str, CudaFunction>,
}

impl KernelRegistry {
    /// Compiles and loads every source on `ctx`'s device.
    fn build(ctx: &Arc<CudaContext>) -> Result<Self> {
        let (major, minor) = ctx
            .compute_capability()
            .map_err(driver_err("cuDeviceGetAttribute(compute capability)"))?;
        let arch = arch_for(major, minor);
        let mut functions = HashMap::new();
        for source in SOURCES {
            let ptx = compile(source, arch)?;
            let module = ctx
                .load_module(ptx)
                .map_err(driver_err("cuModuleLoadData"))?;
            for &name in source.functions {
                let f = module
                    .load_function(name)
                    .map_err(driver_err("cuModuleGetFunction"))?;
                functions.insert(name, f);
            }
        }
        Ok(Self { functions })
    }

    /// The registry of `ctx`'s device, built on first use and cached for the process.
    ///
    /// # Errors
    /// As [`compile`], or a driver error while loading a module.
    pub fn for_context(ctx: &Arc<CudaContext>) -> Result<Arc<Self>> {
        static CACHE: OnceLock<Mutex<HashMap<usize, Arc<KernelRegistry>>>> = OnceLock::new();
        let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
        // A panic while building leaves the map consistent (nothing was inserted), so a
        // poisoned lock is still usable.
        let mut cache = cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(found) = cache.get(&ctx.ordinal()) {
            return Ok(Arc::clone(found));
        }
        let built = Arc::new(Self::build(ctx)?);
        cache.insert(ctx.ordinal(), Arc::clone(&built));
        Ok(built)
    }

    /// The kernel `name` (a name listed in [`SOURCES`]).
    ///
    /// # Panics
    /// If `name` is not a kernel of [`SOURCES`]: a typo in this crate, not a user input.
    #[must_use]
    pub fn get(&self, name: &str) -> &CudaFunction {
        match self.functions.get(name) {
            Some(f) => f,
            None => panic!("no CUDA kernel named {name} in SOURCES"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_compute_capabilities_map_to_their_sm_name() {
        assert_eq!(arch_for(9, 0), Some("sm_90"));
        assert_eq!(arch_for(8, 0), Some("sm_80"));
        assert_eq!(arch_for(6, 1), None);
    }
}
