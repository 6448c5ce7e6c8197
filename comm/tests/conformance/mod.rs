//! The conformance suite every backend passes: generic bodies `fn(&Communicator) -> Result`
//! that every rank of a group runs. `conformance/local.rs` runs them on local groups of 1..=4
//! threads; `mpi_conformance.rs` runs them with one process per rank under `mpirun`.
//!
//! A body issues the same collectives on every rank whatever its data, and checks only after
//! its collectives, so a failed check on one rank never desynchronises the group. Every rank
//! computes every rank's input from (seed, rank), so each can check the whole result.
#![allow(dead_code, reason = "each test binary uses the cases through CASES")]

use zero_comm::{CommError, Communicator};

/// Fails the case with a message unless `cond` holds.
macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err($crate::conformance::Failure(format!($($fmt)+)));
        }
    };
}

/// Stamps one `#[test]` per named case, each running `run_case(n, case)` (a function the
/// including test binary defines, returning the failures) on groups of 1..=4 ranks, and
/// `STAMPED`, the names in order, for a test that the list matches [`CASES`].
#[allow(unused_macros, reason = "the MPI binary runs the cases its own way")]
macro_rules! stamp_cases {
    ($($name:ident),* $(,)?) => {$(
        #[test]
        fn $name() {
            let case = $crate::conformance::CASES
                .iter()
                .find(|(n, _)| *n == stringify!($name))
                .map(|&(_, f)| f)
                .expect("a case of that name");
            for n in 1..=4 {
                let failures = run_case(n, case);
                assert!(failures.is_empty(), "{} ranks: {failures:#?}", n);
            }
        }
    )*
        const STAMPED: &[&str] = &[$(stringify!($name)),*];
    };
}

/// [`stamp_cases!`] over every case of [`CASES`], by name (the list the `STAMPED` test checks).
#[allow(unused_macros, reason = "the MPI binary runs the cases its own way")]
macro_rules! stamp_every_case {
    () => {
        stamp_cases!(
            all_reduce,
            reduce_scatter,
            all_gather,
            broadcast,
            reduce,
            barrier,
            counts_by_kind,
            split_grid,
            split_key_order,
            async_in_issue_order,
            async_matches_blocking,
            bitwise_rank_order,
            f64_rank_order_bits,
            integer_sums_wrap,
            bad_arguments,
        );
    };
}

mod cases;
mod data;

pub use cases::CASES;

/// A failed check, or a collective's error.
#[derive(Debug)]
pub struct Failure(pub String);

impl From<CommError> for Failure {
    fn from(e: CommError) -> Self {
        Failure(format!("collective failed: {e}"))
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a case returns.
pub type Result<T = ()> = std::result::Result<T, Failure>;

/// A conformance case: run by every rank of `comm`'s group.
pub type Case = fn(&Communicator) -> Result;
