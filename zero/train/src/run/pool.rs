//! The rayon pool each rank of this process computes on.
//!
//! The model's kernels (gemm, the row-split kernels) and the engine's element-wise passes
//! split their work over the current rayon pool. Called from a thread outside any pool, each
//! such call is handed to the global pool while the caller sleeps until it returns: a
//! wake-up and a hand-over between threads for every call, hundreds per micro-step. Ranks of
//! one process also share that one pool, so a rank's call waits behind the other ranks'
//! kernels. So each rank runs on a pool of its own, on one of the pool's threads, with the
//! threads shared out evenly between the ranks: a call runs on the thread that makes it and
//! only its forks cross threads, onto the rank's own threads.
//!
//! Every kernel gives the same bits whatever the pool size (each reduction has a fixed
//! order), so the split changes timing only.

use crate::error::TrainError;

/// The threads of each rank's pool when `ranks` ranks share this process: those of the
/// current pool (the global one, sized by `RAYON_NUM_THREADS` or the cores, unless the run
/// was started inside another pool) shared out evenly, at least one.
pub(super) fn threads_per_rank(ranks: usize) -> usize {
    (rayon::current_num_threads() / ranks.max(1)).max(1)
}

/// Runs `work`, rank `rank`'s, on a new pool of `threads` threads, on one of them; the pool
/// ends with it. A panic in `work` propagates to the caller.
///
/// # Errors
/// `work`'s; [`TrainError::Spawn`] when the pool's threads cannot start.
pub(super) fn on_own_pool<T: Send>(
    rank: usize,
    threads: usize,
    work: impl FnOnce() -> Result<T, TrainError> + Send,
) -> Result<T, TrainError> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(move |i| format!("zero-rank{rank}-{i}"))
        .build()
        .map_err(|e| TrainError::Spawn {
            rank,
            source: std::io::Error::other(e),
        })?;
    pool.install(work)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_share_the_threads_evenly_and_get_one_at_least() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(6)
            .build()
            .unwrap();
        pool.install(|| {
            assert_eq!(threads_per_rank(1), 6);
            assert_eq!(threads_per_rank(2), 3);
            assert_eq!(threads_per_rank(4), 1);
            assert_eq!(threads_per_rank(8), 1);
            assert_eq!(threads_per_rank(0), 6);
        });
    }

    #[test]
    fn work_runs_on_a_pool_of_the_given_size_on_one_of_its_threads() {
        let outside = std::thread::current().id();
        let seen = on_own_pool(3, 3, || {
            let name = std::thread::current().name().map(str::to_string);
            Ok((
                rayon::current_num_threads(),
                rayon::current_thread_index().is_some(),
                std::thread::current().id() != outside,
                name,
            ))
        })
        .unwrap();
        let (threads, on_pool, other_thread, name) = seen;
        assert_eq!((threads, on_pool, other_thread), (3, true, true));
        assert!(name.is_some_and(|n| n.starts_with("zero-rank3-")));
    }

    #[test]
    fn the_work_s_error_comes_back() {
        let got = on_own_pool(0, 1, || -> Result<(), TrainError> {
            Err(TrainError::RankPanicked {
                rank: 0,
                message: "boom".into(),
            })
        });
        assert!(matches!(got, Err(TrainError::RankPanicked { rank: 0, .. })));
    }
}
