//! `zero-train launch`: torchelastic's restart loop for one machine. It starts N rank
//! processes of the TCP backend with torchrun's variables (or, for `--backend mpi`, one
//! `mpirun -np N`), and when one fails it stops the others and starts all again from the newest complete state of `--save`, up to
//! `--max-restarts` times, with one rank fewer (down to `--min-nproc`) when the same rank
//! failed twice in a row. The ranks learn the attempt from `TORCHELASTIC_RESTART_COUNT`.
//!
//! As in torchft's lighthouse, the rules are a pure function ([`decide`]) tested apart from
//! any process; `procs` runs the processes.

mod procs;

pub use procs::launch;

/// Most rank processes one launch starts (zero-train's limit on ranks).
pub const MAX_NPROC: usize = zero::MAX_RANKS;

/// `zero-train launch`'s flags.
#[derive(Debug, Clone, clap::Args)]
pub struct LaunchArgs {
    /// Rank processes to start (torchrun's --nproc-per-node).
    #[arg(long, allow_negative_numbers = true)]
    pub nproc_per_node: usize,
    /// Restarts allowed after failures (torchrun's --max-restarts); 0: fail at the first.
    #[arg(long, allow_negative_numbers = true, default_value_t = 0)]
    pub max_restarts: u32,
    /// Fewest ranks a restart may shrink to when a rank keeps failing (default: no shrink).
    #[arg(long, allow_negative_numbers = true)]
    pub min_nproc: Option<usize>,
    /// The mpirun command, with its own flags, that starts the ranks of `--backend mpi`
    /// (e.g. "mpirun --oversubscribe"); `-np N` and zero-train's path and flags follow it.
    #[arg(long, default_value = "mpirun")]
    pub mpirun: String,
    /// The training flags every rank gets (after `--`); `--backend tcp` is added unless a
    /// backend is given (tcp, nccl or mpi), and `--resume` is set to the newest complete
    /// state of `--save` on restarts.
    #[arg(last = true, required = true)]
    pub train: Vec<String>,
}

/// The restart rules' inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// Ranks of the first attempt.
    pub nproc: usize,
    /// Fewest ranks a restart may use.
    pub min_nproc: usize,
    /// Restarts allowed.
    pub max_restarts: u32,
}

impl Policy {
    /// The policy of `args`, checked.
    ///
    /// # Errors
    /// A count out of range, naming its flag.
    pub fn of(args: &LaunchArgs) -> Result<Self, String> {
        let nproc = args.nproc_per_node;
        if !(1..=MAX_NPROC).contains(&nproc) {
            return Err(format!(
                "--nproc-per-node {nproc}: expected 1 to {MAX_NPROC}"
            ));
        }
        let min_nproc = args.min_nproc.unwrap_or(nproc);
        if !(1..=nproc).contains(&min_nproc) {
            return Err(format!(
                "--min-nproc {min_nproc}: expected 1 to --nproc-per-node {nproc}"
            ));
        }
        Ok(Self {
            nproc,
            min_nproc,
            max_restarts: args.max_restarts,
        })
    }
}

/// What the launcher does after an attempt failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Start again with this many ranks.
    Restart {
        /// Ranks of the next attempt.
        world: usize,
    },
    /// The restart budget is spent: the launch fails.
    GiveUp,
}

/// The rule: restart while the budget lasts (`restarts_done` of `policy.max_restarts`);
/// with one rank fewer, not below `min_nproc`, when `failed_rank` also failed the attempt
/// before (`previous_failed`) at the same world size, since restarting the same slot again
/// would likely fail again; otherwise at the same world size. `None`: the failed rank is
/// not known (mpirun reports only its own status), which never shrinks the world.
pub fn decide(
    policy: &Policy,
    restarts_done: u32,
    world: usize,
    failed_rank: Option<usize>,
    previous_failed: Option<usize>,
) -> Decision {
    if restarts_done >= policy.max_restarts {
        return Decision::GiveUp;
    }
    let keeps_failing = failed_rank.is_some() && previous_failed == failed_rank;
    if keeps_failing && world > policy.min_nproc {
        Decision::Restart { world: world - 1 }
    } else {
        Decision::Restart { world }
    }
}

#[cfg(test)]
mod tests {
    use super::{decide, Decision, Policy};

    const POLICY: Policy = Policy {
        nproc: 4,
        min_nproc: 3,
        max_restarts: 2,
    };

    #[test]
    fn a_first_failure_restarts_at_the_same_world() {
        let same = Decision::Restart { world: 4 };
        assert_eq!(decide(&POLICY, 0, 4, Some(1), None), same);
        assert_eq!(decide(&POLICY, 1, 4, Some(2), Some(1)), same);
        // An unknown rank (mpirun's failure) never counts as the same rank again.
        assert_eq!(decide(&POLICY, 1, 4, None, None), same);
    }

    #[test]
    fn a_rank_failing_twice_in_a_row_shrinks_the_world_down_to_min_nproc() {
        assert_eq!(
            decide(&POLICY, 1, 4, Some(1), Some(1)),
            Decision::Restart { world: 3 }
        );
        let wide = Policy {
            max_restarts: 9,
            ..POLICY
        };
        assert_eq!(
            decide(&wide, 2, 3, Some(1), Some(1)),
            Decision::Restart { world: 3 }
        );
    }

    #[test]
    fn the_budget_spent_gives_up_whatever_failed() {
        assert_eq!(decide(&POLICY, 2, 4, Some(1), None), Decision::GiveUp);
        let none = Policy {
            max_restarts: 0,
            ..POLICY
        };
        assert_eq!(decide(&none, 0, 4, Some(0), None), Decision::GiveUp);
    }
}
