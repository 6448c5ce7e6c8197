//! Vectorisable elementwise math for the kernels: exp, tanh, dot, max and sum.
//!
//! `f32::exp`/`tanh` call libm once per element and stop the compiler from vectorising the
//! loops around them; in the GPT-2 step those loops (GELU over (N,4C) per layer, softmax over
//! (N,Vp)) cost as much as several matmuls. These versions are branch-free straight-line code
//! that LLVM vectorises, accurate to a few ulp (tested against std below). Reductions keep
//! `LANES` partial results so they vectorise too; their order is fixed, so results stay
//! deterministic.

/// Partial sums kept by the reductions: 16 f32 = one AVX-512 register, two AVX2 ones.
const LANES: usize = 16;

const LOG2E: f32 = std::f32::consts::LOG2_E;
/// ln 2 split so that n * LN2_HI is exact for |n| < 2^9 (Cody-Waite reduction).
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// 1.5 * 2^23: adding it rounds to the nearest integer and leaves it in the low mantissa bits.
const ROUND_MAGIC: f32 = 12_582_912.0;

/// e^x, relative error below 3e-7 for x in [-87, 88]; inputs are clamped to that range, so
/// large negative x gives about 1e-38 instead of 0 (harmless in a softmax) and no NaN from
/// infinities.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    let x = x.clamp(-87.0, 88.0);
    // x = n ln2 + r with |r| <= ln2 / 2, so e^x = 2^n e^r.
    let shifted = x * LOG2E + ROUND_MAGIC;
    let n = shifted - ROUND_MAGIC;
    let n_int = shifted.to_bits() as i32 - ROUND_MAGIC.to_bits() as i32;
    let r = x - n * LN2_HI - n * LN2_LO;
    // Taylor series to r^7: truncation below 1e-8 relative on |r| <= 0.35.
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0
                    + r * (1.0 / 24.0
                        + r * (1.0 / 120.0 + r * (1.0 / 720.0 + r * (1.0 / 5040.0)))))));
    // 2^n built in the exponent field; n is in -126..=127 after the clamp.
    let scale = f32::from_bits(((n_int + 127) as u32) << 23);
    p * scale
}

/// tanh(x) = 1 - 2 / (e^{2x} + 1): absolute error below 3e-7 (relative error grows near 0,
/// which GELU does not see: it uses 1 + tanh).
#[inline(always)]
pub(crate) fn tanh(x: f32) -> f32 {
    1.0 - 2.0 / (exp(2.0 * x) + 1.0)
}

/// Σ a[i] b[i] over the common length.
#[inline]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let len = a.len().min(b.len());
    let (a, b) = (&a[..len], &b[..len]);
    let mut acc = [0.0f32; LANES];
    let (ac, bc) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail: f32 = ac
        .remainder()
        .iter()
        .zip(bc.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ac.zip(bc) {
        for i in 0..LANES {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// max of `a` (NEG_INFINITY when empty).
#[inline]
pub(crate) fn max(a: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let chunks = a.chunks_exact(LANES);
    let tail = chunks
        .remainder()
        .iter()
        .fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    for x in chunks {
        for i in 0..LANES {
            // `if` rather than f32::max: no NaN bookkeeping, so it compiles to a vector max.
            acc[i] = if x[i] > acc[i] { x[i] } else { acc[i] };
        }
    }
    acc.iter().fold(tail, |m, &x| m.max(x))
}

/// x[i] = e^(x[i] - shift) in place; returns the sum of the new values.
#[inline]
pub(crate) fn exp_shifted_sum(x: &mut [f32], shift: f32) -> f32 {
    let mut acc = [0.0f32; LANES];
    let mut chunks = x.chunks_exact_mut(LANES);
    for c in &mut chunks {
        for i in 0..LANES {
            c[i] = exp(c[i] - shift);
            acc[i] += c[i];
        }
    }
    let mut tail = 0.0;
    for v in chunks.into_remainder() {
        *v = exp(*v - shift);
        tail += *v;
    }
    acc.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_matches_std_within_a_few_ulp() {
        let mut x = -87.0f32;
        while x < 88.0 {
            let (got, want) = (exp(x), x.exp());
            assert!(
                ((got - want) / want).abs() < 3e-7,
                "exp({x}) = {got}, std {want}"
            );
            x += 0.0137;
        }
        assert!(exp(-1000.0) < 1e-37 && exp(1000.0).is_finite());
    }

    #[test]
    fn tanh_matches_std() {
        let mut x = -20.0f32;
        while x < 20.0 {
            assert!((tanh(x) - x.tanh()).abs() < 3e-7, "tanh({x})");
            x += 0.0031;
        }
    }

    #[test]
    fn reductions_match_naive_ones() {
        let a: Vec<f32> = (0..37).map(|i| ((i * 7) % 11) as f32 - 5.0).collect();
        let b: Vec<f32> = (0..37).map(|i| ((i * 3) % 5) as f32 * 0.5).collect();
        let naive: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        assert_eq!(dot(&a, &b), naive); // small integers and halves: every order is exact
        assert_eq!(max(&a), 5.0);
        assert_eq!(max(&[]), f32::NEG_INFINITY);
        let mut e = a.clone();
        let s = exp_shifted_sum(&mut e, 5.0);
        let want: f32 = a.iter().map(|x| (x - 5.0).exp()).sum();
        assert!((s - want).abs() < 1e-5 * want);
    }
}
