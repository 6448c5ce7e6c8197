//! Many mixed collectives with random per-rank delays: the barrier protocol must keep every
//! result exact whatever the interleaving (a race in slot reuse or phase ordering shows up
//! here as a wrong value).

mod common;

use common::run;
use std::time::Duration;
use zero_comm::{local, ReduceOp};

fn jitter(state: &mut u64) {
    *state = state
        .wrapping_mul(6_364_136_223_846_793_005)
        .wrapping_add(1_442_695_040_888_963_407);
    match (*state >> 33) % 4 {
        0 => std::thread::yield_now(),
        1 => std::thread::sleep(Duration::from_micros((*state >> 40) % 50)),
        _ => {}
    }
}

#[test]
fn mixed_ops_with_random_delays_stay_exact() {
    for n in [2usize, 3, 5] {
        run(local::create(n).unwrap(), |c| {
            let r = c.rank();
            let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ r as u64;
            let tri = (n * (n - 1) / 2) as f32;
            for step in 0..60usize {
                let len = n * (1 + step % 7);
                jitter(&mut rng);
                match step % 5 {
                    0 => {
                        let mut x = vec![(r + step) as f32; len];
                        c.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap();
                        assert!(
                            x.iter().all(|&v| v == tri + (n * step) as f32),
                            "step {step}"
                        );
                    }
                    1 => {
                        let x = vec![r as f32; len];
                        let mut y = vec![0f32; len / n];
                        c.reduce_scatter(&x, &mut y, ReduceOp::Max).unwrap();
                        assert!(y.iter().all(|&v| v == (n - 1) as f32), "step {step}");
                    }
                    2 => {
                        let mut x = vec![0f32; len];
                        let per = len / n;
                        x[r * per..(r + 1) * per].fill(r as f32);
                        c.all_gather_in_place(&mut x).unwrap();
                        assert!(
                            x.iter().enumerate().all(|(i, &v)| v == (i / per) as f32),
                            "step {step}"
                        );
                    }
                    3 => {
                        let root = step % n;
                        let mut x = vec![r as f32; len];
                        c.broadcast_in_place(&mut x, root).unwrap();
                        assert!(x.iter().all(|&v| v == root as f32), "step {step}");
                    }
                    _ => {
                        let w = c.all_reduce_async(vec![1f32; len], ReduceOp::Sum);
                        jitter(&mut rng);
                        assert!(
                            w.wait().unwrap().iter().all(|&v| v == n as f32),
                            "step {step}"
                        );
                    }
                }
            }
        });
    }
}
