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
