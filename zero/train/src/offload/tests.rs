//! The offloader on its own, with `Vec` slots: each restore gives back what was kept (against
//! a plain per-segment copy), a stale prefetch never wins over a newer keep, and a panicked
//! copy job is an error from the next call that waits on it, then from every call.

use super::*;

const N: usize = 6;

fn offloader(segments: usize, slots: usize) -> OffloadedInputs {
    let slots = (0..slots)
        .map(|_| Box::new(vec![0f32; N]) as Buffer)
        .collect();
    let hosts = (0..segments)
        .map(|_| PinnedBuffer::new(N * 4).unwrap())
        .collect();
    OffloadedInputs::new(slots, hosts, N).unwrap()
}

fn input(tag: usize) -> Vec<f32> {
    (0..N).map(|i| (tag * 10 + i) as f32).collect()
}

fn restored(kept: &mut OffloadedInputs, segment: usize) -> Vec<f32> {
    let mut out = vec![-1f32; N];
    kept.restore(segment, &mut out).unwrap();
    out
}

#[test]
fn restores_give_back_what_was_kept_in_any_order_with_or_without_hints() {
    let mut kept = offloader(5, 2);
    let reference: Vec<Vec<f32>> = (0..5).map(input).collect();
    for (s, x) in reference.iter().enumerate() {
        kept.keep(s, x).unwrap();
    }
    kept.due_next(3).unwrap();
    assert_eq!(restored(&mut kept, 3), reference[3]);
    kept.due_next(0).unwrap();
    kept.due_next(4).unwrap();
    assert_eq!(restored(&mut kept, 1), reference[1], "never hinted");
    assert_eq!(restored(&mut kept, 4), reference[4]);
    assert_eq!(restored(&mut kept, 0), reference[0]);
    assert_eq!(restored(&mut kept, 0), reference[0], "restored twice");
    assert_eq!((kept.resident_bytes(), kept.offloaded_bytes()), (48, 120));
}

#[test]
fn a_keep_after_a_prefetch_of_the_same_segment_wins() {
    let mut kept = offloader(2, 2);
    kept.keep(0, &input(1)).unwrap();
    kept.keep(1, &input(2)).unwrap();
    kept.due_next(0).unwrap();
    kept.keep(0, &input(3)).unwrap();
    assert_eq!(restored(&mut kept, 0), input(3));
    assert_eq!(restored(&mut kept, 1), input(2));
}

#[test]
fn a_panicked_copy_job_is_an_error_from_the_next_waiting_call_and_after() {
    let mut kept = offloader(3, 2);
    kept.keep(0, &input(0)).unwrap();
    kept.0.send(0, protocol::Job::Panic).unwrap();
    let first = kept.restore(0, &mut [0.0; N]);
    assert!(
        matches!(&first, Err(GptError::KeptInputs { reason, .. }) if reason.contains("stopped")),
        "{first:?}"
    );
    assert!(kept.keep(1, &input(1)).is_err(), "a later call succeeded");
    assert!(kept.due_next(2).is_err());
    drop(kept); // joins the dead thread without hanging
}

#[test]
fn out_of_range_segments_and_wrong_lengths_are_refused() {
    let mut kept = offloader(2, 1);
    assert!(kept.keep(2, &input(0)).is_err());
    assert!(kept.keep(0, &[0.0; N - 1]).is_err());
    assert!(kept.due_next(5).is_err());
    kept.keep(1, &input(4)).unwrap();
    assert_eq!(restored(&mut kept, 1), input(4), "a refusal broke nothing");
    let short_slot = vec![Box::new(vec![0f32; N - 1]) as Buffer];
    let host = vec![PinnedBuffer::new(N * 4).unwrap()];
    assert!(OffloadedInputs::new(short_slot, host, N).is_err());
}
