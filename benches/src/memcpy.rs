//! The machine's memcpy bandwidth, the baseline zero-bench prints beside collectives.

use std::time::Instant;

/// Aggregate memcpy bandwidth in GB/s (decimal) of `threads` threads each copying its own
/// `bytes`-byte buffer `iters` times, counting bytes read plus bytes written (2 x bytes per
/// copy), the same accounting as [`zero_comm::local::memory_traffic`].
pub fn memcpy_bandwidth(threads: usize, bytes: usize, iters: usize) -> f64 {
    let barrier = std::sync::Barrier::new(threads);
    let secs: Vec<f64> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let src = vec![1u8; bytes];
                    let mut dst = vec![0u8; bytes];
                    dst.copy_from_slice(&src); // fault the pages in, outside the timing
                    barrier.wait();
                    let t = Instant::now();
                    for _ in 0..iters {
                        dst.copy_from_slice(std::hint::black_box(&src));
                        std::hint::black_box(&mut dst);
                    }
                    t.elapsed().as_secs_f64()
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or(f64::INFINITY))
            .collect()
    });
    let slowest = secs.iter().copied().fold(0.0, f64::max);
    (2 * bytes * iters * threads) as f64 / slowest / 1e9
}
