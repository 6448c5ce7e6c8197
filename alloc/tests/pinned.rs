//! Pinned host memory, including the fallback when the OS refuses to lock.
//!
//! We run as root, which has CAP_IPC_LOCK, so lowering RLIMIT_MEMLOCK alone would not refuse
//! anything. The fallback test therefore re-runs this test binary as a child process that
//! sets the limit to 0 and then drops to an unprivileged user (losing every capability), so
//! the refusal comes from the real kernel path.

use std::process::Command;

use zero_alloc::{Arena, ArenaConfig, Backing, PinnedBuffer};

const CHILD_ENV: &str = "ZERO_ALLOC_REFUSE_LOCK_CHILD";

#[test]
fn pinned_buffer_is_usable_and_typed() {
    let mut buf = PinnedBuffer::new(64).unwrap();
    buf.as_slice_mut::<f32>().unwrap()[3] = 2.5;
    assert_eq!(buf.as_slice::<f32>().unwrap()[3], 2.5);
    assert_eq!(buf.as_slice::<u8>().unwrap().len(), 64);
    assert!(buf.as_slice::<[u8; 3]>().is_err());
}

#[test]
fn pinned_buffer_of_zero_bytes_is_empty() {
    let buf = PinnedBuffer::new(0).unwrap();
    assert!(buf.is_empty());
    assert!(buf.as_slice::<f32>().unwrap().is_empty());
}

#[test]
fn pinned_buffer_locks_within_the_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes into the struct we pass.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) };
    assert_eq!(rc, 0);
    if limit.rlim_cur < 1 << 20 {
        return; // a tiny limit (and maybe no CAP_IPC_LOCK): refusal is the expected outcome
    }
    let buf = PinnedBuffer::new(64 << 10).unwrap();
    assert!(buf.is_locked(), "{:?}", buf.fallback_reason());
}

#[test]
fn pinned_falls_back_to_pageable_when_lock_is_refused() {
    let exe = std::env::current_exe().unwrap();
    let out = Command::new(exe)
        .args([
            "--exact",
            "refused_lock_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("CHILD: fallback verified"),
        "child did not run the check:\n{stdout}"
    );
}

/// Runs only inside the child started above; a no-op in ordinary runs.
#[test]
fn refused_lock_child() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let zero = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: setrlimit and setuid take plain values; this child process exists only to run
    // this test, so changing its limits and user affects nothing else.
    unsafe {
        assert_eq!(libc::setrlimit(libc::RLIMIT_MEMLOCK, &zero), 0, "setrlimit");
        if libc::geteuid() == 0 {
            assert_eq!(libc::setuid(65534), 0, "setuid(nobody)");
        }
    }
    // The refusal is real: a raw mlock of a page now fails.
    let probe = vec![0u8; 8192];
    // SAFETY: mlock only reads the range's address; `probe` lives across the call.
    let rc = unsafe { libc::mlock(probe.as_ptr().cast(), probe.len()) };
    assert_ne!(rc, 0, "mlock still allowed; the test would prove nothing");

    let mut buf = PinnedBuffer::new(1 << 20).unwrap();
    assert!(!buf.is_locked());
    assert!(buf.fallback_reason().is_some());
    buf.as_bytes_mut().fill(5);
    assert!(buf.as_bytes().iter().all(|&x| x == 5));

    let mut arena = Arena::new(ArenaConfig::new(1 << 20).backing(Backing::Pinned)).unwrap();
    assert!(!arena.is_page_locked());
    let h = arena.alloc(4096).unwrap();
    arena.slice_mut::<u8>(h).unwrap().fill(1);
    assert_eq!(arena.slice::<u8>(h).unwrap()[4095], 1);
    println!("CHILD: fallback verified");
}

/// An arena asking for CUDA registration on a machine with no driver (or a build without
/// `cuda`) falls back to page-locking with mlock, and its blocks work.
#[test]
fn cuda_registered_backing_without_a_driver_falls_back_to_mlock() {
    #[cfg(feature = "cuda")]
    if zero_alloc::CudaLibrary::Driver.require().is_ok() {
        eprintln!("skipped: a CUDA driver is present; gpu-check covers registration");
        return;
    }
    let config = ArenaConfig::new(1 << 20).backing(Backing::CudaRegistered(0));
    let mut arena = Arena::new(config).unwrap();
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes into the struct we pass.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) };
    // Within the limit the mlock fallback is granted (as in `pinned_buffer_locks_within_the_limit`).
    if rc == 0 && limit.rlim_cur >= 1 << 20 {
        assert!(arena.is_page_locked());
    }
    let h = arena.alloc(4096).unwrap();
    arena.slice_mut::<u8>(h).unwrap().fill(3);
    assert_eq!(arena.slice::<u8>(h).unwrap()[4095], 3);
}
