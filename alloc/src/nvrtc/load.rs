//! Compiling a [`Program`] with NVRTC and loading a [`KernelSet`] on a device (feature
//! `cuda`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use cudarc::driver::{CudaContext, CudaFunction};
use cudarc::nvrtc::{self, CompileError, CompileOptions, Ptx};

use super::{arch_for, KernelSet, Program};
use crate::cuda::cuda_err;
use crate::error::{AllocError, Result};
use crate::libraries::CudaLibrary;

impl Program {
    /// Compiles the program to PTX for `arch` (`None`: NVRTC's default target).
    ///
    /// # Errors
    /// [`AllocError::CudaUnavailable`] when NVRTC is missing; [`AllocError::Nvrtc`] with
    /// the compiler's log when the source does not compile.
    pub fn compile(&self, arch: Option<&'static str>) -> Result<Ptx> {
        CudaLibrary::Nvrtc.require()?;
        let opts = CompileOptions {
            arch,
            options: self.options.iter().map(|s| (*s).to_string()).collect(),
            name: Some(self.name.to_string()),
            ..CompileOptions::default()
        };
        nvrtc::compile_ptx_with_opts(self.source(), opts).map_err(|e| AllocError::Nvrtc {
            program: self.name,
            arch: arch.unwrap_or("the default target"),
            log: match e {
                CompileError::CompileError { log, .. } => log.to_string_lossy().into_owned(),
                other => format!("{other:?}"),
            },
        })
    }
}

/// Every kernel of a [`KernelSet`], loaded on one device.
#[derive(Debug)]
pub struct LoadedKernels {
    functions: HashMap<&'static str, CudaFunction>,
}

impl LoadedKernels {
    /// The kernels of `set` on `ctx`'s device: compiled for its architecture (a CUBIN when
    /// [`arch_for`] knows it, else PTX) and loaded on first use in the process, shared
    /// afterwards.
    ///
    /// # Errors
    /// As [`Program::compile`], or [`AllocError::Cuda`] when the driver refuses a module or
    /// a function.
    pub fn for_context(ctx: &Arc<CudaContext>, set: &'static KernelSet) -> Result<Arc<Self>> {
        type Cache = HashMap<(usize, &'static str), Arc<LoadedKernels>>;
        static CACHE: OnceLock<Mutex<Cache>> = OnceLock::new();
        // Nothing is inserted before a build completes, so a poisoned map is still consistent.
        let mut cache = CACHE
            .get_or_init(Mutex::default)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let key = (ctx.ordinal(), set.name);
        if let Some(found) = cache.get(&key) {
            return Ok(Arc::clone(found));
        }
        let built = Arc::new(Self::build(ctx, set)?);
        cache.insert(key, Arc::clone(&built));
        Ok(built)
    }

    fn build(ctx: &Arc<CudaContext>, set: &KernelSet) -> Result<Self> {
        let (major, minor) = ctx
            .compute_capability()
            .map_err(cuda_err("cuDeviceGetAttribute(compute capability)"))?;
        let arch = arch_for(major, minor);
        let mut functions = HashMap::new();
        for program in set.programs {
            // A known architecture gets its machine code (no JIT, no driver-version trap:
            // `cubin`); an unknown one PTX for the driver to JIT.
            let image = match arch {
                Some(arch) => Ptx::from_binary(program.compile_cubin(arch)?),
                None => program.compile(None)?,
            };
            let module = ctx
                .load_module(image)
                .map_err(cuda_err("cuModuleLoadData"))?;
            for &name in program.functions {
                let f = module
                    .load_function(name)
                    .map_err(cuda_err("cuModuleGetFunction"))?;
                functions.insert(name, f);
            }
        }
        Ok(Self { functions })
    }

    /// The kernel `name`, if the set defines it.
    #[must_use]
    pub fn get(&self, name: &str) -> Option<&CudaFunction> {
        self.functions.get(name)
    }
}
