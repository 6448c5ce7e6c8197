//! Compiling a [`Program`] to a CUBIN: machine code for one real architecture, which the
//! driver loads as it is (feature `cuda`).
//!
//! Why not PTX alone: the driver JIT-compiles PTX only if it is at least as new as the NVRTC
//! that wrote it (a 13.0 driver refuses PTX from a 13.1 NVRTC), while a CUBIN loads on any
//! driver of the same major version; the CUBIN also spares the JIT at load, and compiling it
//! runs the assembler (`ptxas`), whose errors (registers, shared memory) PTX alone hides.
//!
//! Soundness, which every `// SAFETY:` below cites:
//! - P1 (lifetime): the program handle is created by `nvrtcCreateProgram` in
//!   [`ProgramHandle::create`] and destroyed only by its `Drop`, so every call between gets a
//!   live handle; the source and name `CString`s it was made from outlive it (fields of the
//!   handle).
//! - P2 (buffers): each buffer passed to NVRTC is allocated with the size NVRTC reported for
//!   it just before, on the same compiled program.

use std::ffi::CString;
use std::path::{Path, PathBuf};

use cudarc::nvrtc::{result, sys};

use super::prebuilt::cubin_file_name;
use super::{KernelSet, Program};
use crate::error::{AllocError, Result};
use crate::libraries::CudaLibrary;

/// A live NVRTC program and the strings it was created from (P1).
struct ProgramHandle {
    prog: sys::nvrtcProgram,
    _source: CString,
    _name: CString,
}

impl ProgramHandle {
    fn create(program: &Program) -> Result<Self> {
        let source = CString::new(program.source())
            .map_err(|_| nvrtc_error(program, "", "a NUL byte in the source"))?;
        let name = CString::new(program.name)
            .map_err(|_| nvrtc_error(program, "", "a NUL byte in the name"))?;
        let prog = result::create_program(&source, Some(&name))
            .map_err(|e| nvrtc_error(program, "", &format!("nvrtcCreateProgram: {e:?}")))?;
        Ok(Self {
            prog,
            _source: source,
            _name: name,
        })
    }

    /// The compiler's log (empty when it cannot be read).
    fn log(&self) -> String {
        // SAFETY: P1.
        match unsafe { result::get_program_log(self.prog) } {
            Ok(raw) => {
                let bytes: Vec<u8> = raw
                    .iter()
                    .take_while(|&&c| c != 0)
                    .map(|&c| c as u8)
                    .collect();
                String::from_utf8_lossy(&bytes).into_owned()
            }
            Err(e) => format!("(no log: {e:?})"),
        }
    }

    fn cubin(&self) -> std::result::Result<Vec<u8>, sys::nvrtcResult> {
        let mut size = 0usize;
        // SAFETY: P1; `size` is a live usize.
        unsafe { sys::nvrtcGetCUBINSize(self.prog, &mut size) }
            .result()
            .map_err(|e| e.0)?;
        let mut cubin = vec![0u8; size];
        // SAFETY: P1, P2 (`cubin` holds the `size` bytes NVRTC just reported).
        unsafe { sys::nvrtcGetCUBIN(self.prog, cubin.as_mut_ptr().cast()) }
            .result()
            .map_err(|e| e.0)?;
        Ok(cubin)
    }
}

impl Drop for ProgramHandle {
    fn drop(&mut self) {
        // SAFETY: P1: the handle is live and destroyed once, here. A failure leaks it.
        let _ = unsafe { result::destroy_program(self.prog) };
    }
}

fn nvrtc_error(program: &Program, arch: &'static str, log: &str) -> AllocError {
    AllocError::Nvrtc {
        program: program.name,
        arch: if arch.is_empty() { "any target" } else { arch },
        log: log.to_string(),
    }
}

impl Program {
    /// Compiles the program to a CUBIN for the real architecture `arch` (`"sm_90"`).
    ///
    /// # Errors
    /// [`AllocError::CudaUnavailable`] when NVRTC is missing; [`AllocError::Nvrtc`] with the
    /// compiler's log when the source (or its assembly for `arch`) does not compile.
    pub fn compile_cubin(&self, arch: &'static str) -> Result<Vec<u8>> {
        CudaLibrary::Nvrtc.require()?;
        let handle = ProgramHandle::create(self)?;
        let mut options = vec![format!("--gpu-architecture={arch}")];
        options.extend(self.options.iter().map(|s| (*s).to_string()));
        // SAFETY: P1.
        let compiled = unsafe { result::compile_program(handle.prog, &options) };
        if let Err(e) = compiled {
            return Err(nvrtc_error(self, arch, &format!("{e:?}: {}", handle.log())));
        }
        handle
            .cubin()
            .map_err(|code| nvrtc_error(self, arch, &format!("nvrtcGetCUBIN: {code:?}")))
    }
}

/// Compiles every program of `sets` to a CUBIN for each of `archs` and writes it into `dir`
/// under [`cubin_file_name`], where [`super::prebuilt::image_source`] finds it; returns the
/// files written.
///
/// # Errors
/// As [`Program::compile_cubin`]; [`AllocError::Io`] when a file cannot be written.
pub fn write_prebuilt(
    dir: &Path,
    sets: &[&KernelSet],
    archs: &[&'static str],
) -> Result<Vec<PathBuf>> {
    let io = |path: &Path| {
        let path = path.display().to_string();
        move |source| AllocError::Io { path, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let mut written = Vec::new();
    for program in sets.iter().flat_map(|set| set.programs) {
        for &arch in archs {
            let path = dir.join(cubin_file_name(program, arch));
            std::fs::write(&path, program.compile_cubin(arch)?).map_err(io(&path))?;
            written.push(path);
        }
    }
    Ok(written)
}
