//! Random arena op sequences checked against the shadow model, the same interpreter and
//! invariants as the proptests in `alloc/tests/model.rs`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zero_alloc::testing::{ops_from_bytes, Harness};
use zero_alloc::Backing;

const CAPACITY: usize = 16 * 1024;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, ops)) = data.split_first() else { return };
    // The first byte picks the arena's shape: alignment 1..=256, backing, auto-defragment.
    let alignment = 1usize << (mode % 9);
    let backing = if mode & 0x10 != 0 { Backing::Accounting } else { Backing::Memory };
    let auto_defrag = mode & 0x20 == 0;
    let mut harness = match Harness::new(CAPACITY, alignment, backing, auto_defrag) {
        Ok(h) => h,
        Err(e) => panic!("arena construction failed: {e}"),
    };
    if let Err(violation) = harness.run(&ops_from_bytes(ops, CAPACITY)) {
        panic!("{violation}");
    }
});
