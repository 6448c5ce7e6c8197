//! Page-locked ("pinned") host memory, with a fallback to pageable memory.
//!
//! Locking is an optimisation (faster, asynchronous device copies), never a requirement: when
//! the OS refuses (RLIMIT_MEMLOCK without CAP_IPC_LOCK, or not enough lockable memory) the
//! buffer stays pageable and a warning is logged, so a run never fails for it.

use crate::memory::HostRegion;

/// Tries to lock a region; on refusal logs a warning and leaves it pageable.
pub(crate) fn lock_or_warn(region: &mut HostRegion) -> bool {
    match region.lock() {
        Ok(()) => true,
        Err(err) => {
            tracing::warn!(
                bytes = region.len(),
                error = %err,
                "page-locking refused; falling back to pageable host memory"
            );
            false
        }
    }
}
