//! DataLoader: global batches do not depend on the rank count; resume is exact.

use std::sync::Arc;

use proptest::prelude::*;
use zero_train::data::{DataError, DataLoader, LoaderConfig, TokenFile};

fn file(n: usize) -> Arc<TokenFile> {
    // Distinct-ish values so that a wrong offset shows.
    Arc::new(TokenFile::from_tokens((0..n).map(|i| (i * 7 % 50_000) as u16).collect()).unwrap())
}

fn cfg(
    b: usize,
    t: usize,
    rank: usize,
    world: usize,
    accum: usize,
    seed: u64,
    shuffle: bool,
) -> LoaderConfig {
    LoaderConfig {
        micro_batch: b,
        seq_len: t,
        rank,
        world_size: world,
        grad_accum_steps: accum,
        seed,
        shuffle,
    }
}

/// All (inputs, targets) sequences of global batch `step` over all ranks of `c`, sorted.
fn global_batch(f: &Arc<TokenFile>, c: LoaderConfig, step: u64) -> Vec<(Vec<u32>, Vec<u32>)> {
    let (b, t) = (c.micro_batch, c.seq_len);
    let mut rows = Vec::new();
    for rank in 0..c.world_size {
        let mut loader = DataLoader::new(f.clone(), LoaderConfig { rank, ..c }).unwrap();
        for micro in 0..c.grad_accum_steps as u64 {
            let (mut x, mut y) = (vec![0; b * t], vec![0; b * t]);
            loader.micro_batch_at(step, micro, &mut x, &mut y).unwrap();
            for (xs, ys) in x.chunks(t).zip(y.chunks(t)) {
                rows.push((xs.to_vec(), ys.to_vec()));
            }
        }
    }
    rows.sort();
    rows
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn union_over_ranks_equals_single_rank_batch(
        b in 1usize..4, t in 1usize..6, world in 1usize..5, accum in 1usize..4,
        extra in 0usize..200, step in 0u64..20, seed in any::<u64>(), shuffle in any::<bool>(),
    ) {
        let g = b * t * world * accum;
        let f = file(g * 3 + 1 + extra);
        let sharded = global_batch(&f, cfg(b, t, 0, world, accum, seed, shuffle), step);
        let single = global_batch(&f, cfg(b, t, 0, 1, world * accum, seed, shuffle), step);
        prop_assert_eq!(sharded, single);
    }

    #[test]
    fn resume_from_state_continues_identically(stop in 0usize..30, shuffle in any::<bool>()) {
        let f = file(500);
        let c = cfg(2, 3, 1, 2, 2, 11, shuffle);
        let mut straight = DataLoader::new(f.clone(), c).unwrap();
        let mut resumed = DataLoader::new(f, c).unwrap();
        let (mut x, mut y) = (vec![0; 6], vec![0; 6]);
        for _ in 0..stop {
            straight.next_micro_batch(&mut x, &mut y).unwrap();
        }
        let json = serde_json::to_string(&straight.state()).unwrap();
        resumed.restore(&serde_json::from_str(&json).unwrap()).unwrap();
        let (mut x2, mut y2) = (vec![0; 6], vec![0; 6]);
        for _ in 0..20 {
            straight.next_micro_batch(&mut x, &mut y).unwrap();
            resumed.next_micro_batch(&mut x2, &mut y2).unwrap();
            prop_assert_eq!(&x, &x2);
            prop_assert_eq!(&y, &y2);
        }
    }
}

#[test]
fn sequential_batches_follow_the_file_and_wrap_at_epoch_end() {
    let f = Arc::new(TokenFile::from_tokens((0..30).collect()).unwrap());
    // G = 2 * 4 = 8 tokens; (30 - 1) / 8 = 3 windows per epoch.
    let mut loader = DataLoader::new(f, cfg(2, 4, 0, 1, 1, 0, false)).unwrap();
    assert_eq!(loader.batches_per_epoch(), 3);
    let (mut x, mut y) = (vec![0; 8], vec![0; 8]);
    let mut firsts = Vec::new();
    for _ in 0..4 {
        loader.next_micro_batch(&mut x, &mut y).unwrap();
        assert_eq!(
            y.iter().map(|v| v - 1).collect::<Vec<_>>(),
            x,
            "targets are inputs shifted by one"
        );
        firsts.push(x[0]);
    }
    assert_eq!(firsts, vec![0, 8, 16, 0]);
    assert_eq!(loader.epoch(), 1);
}

#[test]
fn shuffled_epoch_visits_every_window_once() {
    let f = Arc::new(TokenFile::from_tokens((0..81).collect()).unwrap());
    let mut loader = DataLoader::new(f, cfg(1, 8, 0, 1, 1, 3, true)).unwrap();
    let (mut x, mut y) = (vec![0; 8], vec![0; 8]);
    let mut starts: Vec<u32> = (0..10)
        .map(|_| {
            loader.next_micro_batch(&mut x, &mut y).unwrap();
            x[0]
        })
        .collect();
    assert_ne!(
        starts,
        (0..10).map(|k| k * 8).collect::<Vec<_>>(),
        "seed 3 does not give file order"
    );
    starts.sort_unstable();
    assert_eq!(starts, (0..10).map(|k| k * 8).collect::<Vec<_>>());
}

#[test]
fn micro_steps_of_ranks_interleave() {
    let f = Arc::new(TokenFile::from_tokens((0..100).collect()).unwrap());
    // B=1, T=2, world 2, accum 2: micro 0 rank 0 -> seq 0, rank 1 -> seq 1, micro 1 rank 0 -> seq 2.
    let mut r1 = DataLoader::new(f, cfg(1, 2, 1, 2, 2, 0, false)).unwrap();
    let (mut x, mut y) = (vec![0; 2], vec![0; 2]);
    r1.next_micro_batch(&mut x, &mut y).unwrap();
    assert_eq!(x, vec![2, 3]);
    r1.next_micro_batch(&mut x, &mut y).unwrap();
    assert_eq!(x, vec![6, 7]);
    r1.next_micro_batch(&mut x, &mut y).unwrap();
    assert_eq!(x, vec![10, 11], "the second global batch starts at token 8");
}

#[test]
fn bad_configurations_are_refused() {
    let f = file(100);
    assert!(matches!(
        DataLoader::new(f.clone(), cfg(0, 4, 0, 1, 1, 0, false)),
        Err(DataError::InvalidConfig { .. })
    ));
    assert!(matches!(
        DataLoader::new(f.clone(), cfg(1, 4, 2, 2, 1, 0, false)),
        Err(DataError::InvalidConfig { .. })
    ));
    assert!(matches!(
        DataLoader::new(f.clone(), cfg(usize::MAX, 4, 0, 1, 1, 0, false)),
        Err(DataError::InvalidConfig { .. })
    ));
    let err = DataLoader::new(f.clone(), cfg(10, 10, 0, 1, 1, 0, false)).unwrap_err();
    assert!(
        matches!(
            err,
            DataError::NotEnoughTokens {
                needed: 101,
                available: 100
            }
        ),
        "{err:?}"
    );
    let mut ok = DataLoader::new(f, cfg(2, 4, 0, 1, 1, 0, false)).unwrap();
    let (mut x, mut y) = (vec![0; 7], vec![0; 8]);
    assert!(matches!(
        ok.next_micro_batch(&mut x, &mut y),
        Err(DataError::BufferSize {
            expected: 8,
            got: 7
        })
    ));
}

#[test]
fn restoring_a_state_from_other_data_is_refused() {
    let a = DataLoader::new(file(100), cfg(2, 4, 0, 1, 1, 0, false)).unwrap();
    let mut b = DataLoader::new(file(200), cfg(2, 4, 0, 1, 1, 0, false)).unwrap();
    let err = b.restore(&a.state()).unwrap_err();
    assert!(err.to_string().contains("file_tokens"), "{err}");
}
