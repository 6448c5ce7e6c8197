//! The `--inject-fault` parser: every field, every refusal, and a round trip of any spec.

use super::{due, FaultKind, FaultSpec};
use proptest::prelude::*;
use zero_comm::OpKind;

fn spec(text: &str) -> Result<FaultSpec, String> {
    text.parse()
}

#[test]
fn every_kind_and_field_parses() {
    let s = spec("slow=250:rank=1,step=3,op=all_gather,seq=17,attempt=2").unwrap();
    assert_eq!(
        s,
        FaultSpec {
            kind: FaultKind::Slow(250),
            rank: 1,
            step: 3,
            op: Some(OpKind::AllGather),
            seq: Some(17),
            attempt: 2,
        }
    );
    for (text, kind) in [
        ("kill", FaultKind::Kill),
        ("hang", FaultKind::Hang),
        ("corrupt", FaultKind::Corrupt),
        ("diverge", FaultKind::Diverge),
    ] {
        let s = spec(&format!("{text}: rank = 0 , step = 2")).unwrap();
        assert_eq!(
            (s.kind, s.rank, s.step, s.op, s.seq, s.attempt),
            (kind, 0, 2, None, None, 0)
        );
    }
}

#[test]
fn bad_specs_are_errors_naming_the_flag_and_the_field() {
    for (text, names) in [
        ("kill", "KIND:rank=R,step=S"),
        ("explode:rank=0,step=1", "unknown fault \"explode\""),
        ("kill:rank=0", "step=S is required"),
        ("kill:step=0", "rank=R is required"),
        (
            "kill:rank=0,step=18446744073709551616",
            "step=18446744073709551616 is past",
        ),
        ("kill:rank=-1,step=0", "rank=\"-1\" is not a whole number"),
        ("kill:rank=0,step=1,step=2", "step is given twice"),
        ("kill:rank=0,step=1,colour=red", "unknown key \"colour\""),
        (
            "kill:rank=0,step=1,op=allreduce",
            "op=\"allreduce\" is not a collective",
        ),
        ("kill:rank=0,step=1,seq", "\"seq\" is not KEY=VALUE"),
        ("slow=:rank=0,step=1", "slow=\"\" is not a whole number"),
        ("slow=3600001:rank=0,step=1", "past the 3600000 ms"),
    ] {
        let err = spec(text).unwrap_err();
        assert!(err.starts_with("--inject-fault"), "{text}: {err}");
        assert!(err.contains(names), "{text}: {err}");
    }
}

#[test]
fn a_fault_is_due_only_at_its_rank_step_and_attempt() {
    let specs = [
        spec("kill:rank=1,step=3").unwrap(),
        spec("hang:rank=1,step=3,attempt=1").unwrap(),
        spec("diverge:rank=0,step=3").unwrap(),
    ];
    assert_eq!(due(&specs, 1, 3, 0), vec![specs[0]]);
    assert_eq!(due(&specs, 1, 3, 1), vec![specs[1]]);
    assert_eq!(due(&specs, 0, 3, 0), vec![specs[2]]);
    assert!(due(&specs, 1, 2, 0).is_empty());
    assert!(due(&specs, 2, 3, 0).is_empty());
}

#[test]
fn only_diverge_has_no_collective_fault() {
    assert!(spec("diverge:rank=0,step=0")
        .unwrap()
        .comm_fault()
        .is_none());
    let f = spec("corrupt:rank=0,step=0,seq=9")
        .unwrap()
        .comm_fault()
        .unwrap();
    assert_eq!((f.op, f.min_seq), (None, 9));
}

fn any_spec() -> impl Strategy<Value = FaultSpec> {
    let kind = prop_oneof![
        Just(FaultKind::Kill),
        Just(FaultKind::Hang),
        (0u64..=3_600_000).prop_map(FaultKind::Slow),
        Just(FaultKind::Corrupt),
        Just(FaultKind::Diverge),
    ];
    let op = proptest::option::of(proptest::sample::select(OpKind::ALL.to_vec()));
    (
        kind,
        any::<u32>(),
        any::<u64>(),
        op,
        any::<Option<u64>>(),
        any::<u64>(),
    )
        .prop_map(|(kind, rank, step, op, seq, attempt)| FaultSpec {
            kind,
            rank: rank as usize,
            step,
            op,
            seq,
            attempt,
        })
}

proptest! {
    #[test]
    fn a_spec_round_trips_through_its_text(s in any_spec()) {
        prop_assert_eq!(spec(&s.to_string()), Ok(s));
    }

    #[test]
    fn no_text_panics_the_parser(text in "[a-z=:,0-9 ]{0,40}") {
        let _ = spec(&text);
    }
}
