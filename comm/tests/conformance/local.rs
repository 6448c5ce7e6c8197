//! The conformance suite on the local backend: every case on groups of 1, 2, 3 and 4 threads.

#[path = "mod.rs"]
#[macro_use]
mod conformance;

use zero_comm::{local, Communicator};

/// Runs `case` on every rank of a local group of `n` and returns the failures, by rank.
fn run_case(n: usize, case: conformance::Case) -> Vec<String> {
    let comms = local::create(n).expect("a local group");
    std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .into_iter()
            .map(|c: Communicator| s.spawn(move || case(&c)))
            .collect();
        hs.into_iter()
            .enumerate()
            .filter_map(|(r, h)| match h.join() {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(format!("rank {r}: {e}")),
                Err(_) => Some(format!("rank {r} panicked")),
            })
            .collect()
    })
}

stamp_every_case!();

#[test]
fn every_case_is_stamped_out() {
    // The macro list above and CASES must not drift apart.
    let names: Vec<&str> = conformance::CASES.iter().map(|&(n, _)| n).collect();
    assert_eq!(names, STAMPED);
}
