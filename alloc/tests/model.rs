//! Property tests: random allocate / free / write / pin / defragment sequences checked
//! against the shadow model in `zero_alloc::testing` (the same code the fuzz target runs).

use proptest::prelude::*;
use zero_alloc::testing::{ops_from_bytes, Harness, Op};
use zero_alloc::Backing;

const CAPACITY: usize = 16 * 1024;

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..CAPACITY / 3).prop_map(Op::Alloc),
        1 => (CAPACITY / 2..2 * CAPACITY).prop_map(Op::Alloc),
        2 => (0..CAPACITY / 3).prop_map(Op::AllocHigh),
        3 => any::<usize>().prop_map(Op::Free),
        1 => any::<usize>().prop_map(Op::FreeStale),
        2 => (any::<usize>(), any::<u8>()).prop_map(|(i, s)| Op::Write(i, s)),
        2 => (any::<usize>(), any::<u8>()).prop_map(|(i, s)| Op::WriteAt(i, s)),
        1 => Just(Op::Defragment),
        1 => any::<usize>().prop_map(Op::Pin),
        1 => any::<usize>().prop_map(Op::Unpin),
        1 => Just(Op::ResetPeak),
    ]
}

fn alignment() -> impl Strategy<Value = usize> {
    prop_oneof![Just(1usize), Just(8), Just(64), Just(256)]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn host_arena_matches_model(ops in prop::collection::vec(op(), 1..120), align in alignment(), auto in any::<bool>()) {
        let mut h = Harness::new(CAPACITY, align, Backing::Memory, auto).unwrap();
        if let Err(e) = h.run(&ops) { panic!("{e}"); }
    }

    #[test]
    fn accounting_arena_matches_model(ops in prop::collection::vec(op(), 1..120), align in alignment()) {
        let mut h = Harness::new(CAPACITY, align, Backing::Accounting, true).unwrap();
        if let Err(e) = h.run(&ops) { panic!("{e}"); }
    }

    #[test]
    fn fuzz_decoder_sequences_match_model(data in prop::collection::vec(any::<u8>(), 0..400)) {
        let mut h = Harness::new(CAPACITY, 256, Backing::Memory, true).unwrap();
        if let Err(e) = h.run(&ops_from_bytes(&data, CAPACITY)) { panic!("{e}"); }
    }
}

#[test]
fn defragment_with_nothing_pinned_leaves_one_hole() {
    let ops = [
        Op::Alloc(1000),
        Op::Alloc(3000),
        Op::Alloc(500),
        Op::Alloc(2000),
        Op::Free(0),
        Op::Free(1),
        Op::Defragment,
    ];
    let mut h = Harness::new(CAPACITY, 256, Backing::Memory, false).unwrap();
    h.run(&ops).unwrap();
    let s = h.arena().stats();
    assert_eq!(s.largest_free, s.total_free);
    assert!(s.bytes_moved > 0);
}
