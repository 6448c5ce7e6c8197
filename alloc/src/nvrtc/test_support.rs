//! What the workspace's NVRTC tests share (feature `cuda`; not part of the stable API).

use crate::libraries::CudaLibrary;

/// True when NVRTC can be loaded. Otherwise the test named `test` prints why it skipped and
/// gets false, unless `ZERO_GPT_REQUIRE_NVRTC=1` (set by scripts/nvrtc-check.sh, where the
/// kernels must compile), which makes the missing library a failure.
///
/// # Panics
/// Under `ZERO_GPT_REQUIRE_NVRTC=1` without NVRTC: that is the test failing.
#[doc(hidden)]
#[must_use]
pub fn nvrtc_or_skip(test: &str) -> bool {
    let Err(why) = CudaLibrary::Nvrtc.require() else {
        return true;
    };
    assert!(
        std::env::var("ZERO_GPT_REQUIRE_NVRTC").as_deref() != Ok("1"),
        "ZERO_GPT_REQUIRE_NVRTC=1 but {why}"
    );
    println!("{test}: skipped: {why}");
    false
}

/// Checks a CUBIN from [`super::Program::compile_cubin`] the way the NVRTC tests do: an ELF
/// image that holds every name of `kernels` (its symbol table spells them out).
///
/// # Errors
/// What is missing.
#[doc(hidden)]
pub fn check_cubin(cubin: &[u8], kernels: &[&str]) -> Result<(), String> {
    if !cubin.starts_with(b"\x7fELF") {
        return Err("not an ELF image".into());
    }
    let holds = |name: &str| cubin.windows(name.len()).any(|w| w == name.as_bytes());
    match kernels.iter().find(|k| !holds(k)) {
        Some(k) => Err(format!("no symbol {k}")),
        None => Ok(()),
    }
}
