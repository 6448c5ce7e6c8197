//! The order in which the CUDA backend's column reductions (`bias_backward`,
//! `layernorm_backward_params`) add, written out on the CPU: the reference their device
//! tests compare with bit for bit, and the proof of the tolerance they are held to against
//! the CPU kernels.
//!
//! Legend: N rows, C columns, R = [`COLUMN_CHUNK_ROWS`] rows per chunk.
//!
//! The CPU kernels add the N rows one by one into the gradient. On the GPU one thread per
//! column walking all N rows leaves most of the device idle, and float atomics would make
//! the result depend on scheduling. The backend instead sums each chunk of R rows from 0 in
//! row order (stage 1), then adds the ceil(N / R) chunk sums in chunk order from 0 and that
//! total into the gradient (stage 2). Every addition is an f32 addition in a fixed order, so
//! the result is deterministic, and compiled without fused multiply-adds it is the bits of
//! [`chunked_column_sums`]. It is not the CPU kernel's sequential sum (the tests below show
//! both), so the contract against the CPU is a tolerance: `1e-5 * (|initial| + Σ|term|)`
//! per column. Both orders are within `γ_N * Σ|term|` of the exact sum (Higham's bound,
//! γ_N = N u / (1 - N u), u = 2^-24: 2.4e-4 at N = 4096) in the worst case; on data of mixed
//! signs the errors are rounding noise, 1.3e-7 of Σ|term| at worst at N = 4096 (below 1e-6
//! asserted), so 1e-5 leaves a wide margin while a wrong row, column or chunk is off by a whole
//! term.

pub use super::geometry::COLUMN_CHUNK_ROWS;

/// `out[j] += Σ_rows term(row, j)` in the GPU's chunked order: for each column, the sum of
/// each chunk of `chunk_rows` rows from 0 in row order, then those sums in chunk order from
/// 0, then one addition into `out[j]`.
///
/// # Panics
/// When `chunk_rows` is 0.
pub fn chunked_column_sums(
    out: &mut [f32],
    rows: usize,
    chunk_rows: usize,
    term: impl Fn(usize, usize) -> f32,
) {
    assert!(chunk_rows > 0, "chunk_rows must be positive");
    if rows == 0 {
        return; // the GPU launches nothing; -0.0 stays -0.0, as on the CPU
    }
    let chunks = rows.div_ceil(chunk_rows);
    for (j, o) in out.iter_mut().enumerate() {
        let mut total = 0.0f32;
        for k in 0..chunks {
            let mut partial = 0.0f32;
            for row in k * chunk_rows..((k + 1) * chunk_rows).min(rows) {
                partial += term(row, j);
            }
            total += partial;
        }
        *o += total;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Rng;

    fn random(n: usize, seed: u64, scale: f32) -> Vec<f32> {
        let mut rng = Rng::new(seed);
        (0..n)
            .map(|_| ((rng.uniform() * 2.0 - 1.0) as f32) * scale)
            .collect()
    }

    /// The CPU kernels' order: rows one by one into the running gradient.
    fn sequential(out: &mut [f32], rows: usize, term: impl Fn(usize, usize) -> f32) {
        for row in 0..rows {
            for (j, o) in out.iter_mut().enumerate() {
                *o += term(row, j);
            }
        }
    }

    #[test]
    fn chunked_sums_are_the_exact_sums_on_small_integers() {
        // Integers below 2^24 add exactly in any order: the chunking covers each row once.
        let (rows, cols) = (131, 5);
        let mut out = vec![1.0; cols];
        chunked_column_sums(&mut out, rows, 64, |r, j| (r * cols + j) as f32);
        for (j, &o) in out.iter().enumerate() {
            let want: usize = (0..rows).map(|r| r * cols + j).sum::<usize>() + 1;
            assert_eq!(o, want as f32, "column {j}");
        }
    }

    #[test]
    fn chunked_order_is_within_the_stated_tolerance_and_is_not_the_sequential_order() {
        let (rows, cols) = (4096, 48);
        let dout = random(rows * cols, 11, 1.0);
        let init = random(cols, 12, 1.0);
        let term = |r: usize, j: usize| dout[r * cols + j];
        let (mut chunked, mut seq) = (init.clone(), init.clone());
        chunked_column_sums(&mut chunked, rows, COLUMN_CHUNK_ROWS, term);
        sequential(&mut seq, rows, term);
        let mut worst = 0.0f64;
        let mut differing = 0;
        for j in 0..cols {
            let scale = f64::from(init[j].abs())
                + (0..rows).map(|r| f64::from(term(r, j).abs())).sum::<f64>();
            let exact = f64::from(init[j]) + (0..rows).map(|r| f64::from(term(r, j))).sum::<f64>();
            for got in [chunked[j], seq[j]] {
                worst = worst.max((f64::from(got) - exact).abs() / scale);
            }
            let gap = f64::from((chunked[j] - seq[j]).abs()) / scale;
            assert!(
                gap <= 1e-5,
                "column {j}: chunked {} seq {}",
                chunked[j],
                seq[j]
            );
            differing += usize::from(chunked[j].to_bits() != seq[j].to_bits());
        }
        // Both orders are rounding noise away from the exact sum (1.3e-7 of Σ|term| at
        // worst on this data), far inside 1e-5 ...
        println!("worst |sum - exact| / Σ|term|: {worst:.2e}");
        assert!(worst < 1e-6, "worst relative error {worst}");
        // ... and the chunked order is another order: most columns differ in their bits.
        assert!(
            differing > cols / 2,
            "only {differing} of {cols} columns differ"
        );
    }

    #[test]
    fn a_wrong_chunking_breaks_the_tolerance() {
        // A chunk that skipped its last row (an off-by-one in row_end) is off by a whole term.
        let (rows, cols) = (4096, 8);
        let dout = random(rows * cols, 21, 1.0);
        let term = |r: usize, j: usize| dout[r * cols + j];
        let skip_last = |r: usize, j: usize| if r % 64 == 63 { 0.0 } else { term(r, j) };
        let (mut good, mut bad) = (vec![0.0; cols], vec![0.0; cols]);
        sequential(&mut good, rows, term);
        chunked_column_sums(&mut bad, rows, COLUMN_CHUNK_ROWS, skip_last);
        let scale: f32 = dout.iter().step_by(cols).map(|x| x.abs()).sum();
        assert!((good[0] - bad[0]).abs() > 1e-5 * scale);
    }

    #[test]
    fn no_rows_leave_the_gradient_untouched() {
        let mut out = vec![-0.0, 3.0];
        chunked_column_sums(&mut out, 0, 64, |_, _| 1.0);
        assert_eq!(out[0].to_bits(), (-0.0f32).to_bits());
        assert_eq!(out[1], 3.0);
    }
}
