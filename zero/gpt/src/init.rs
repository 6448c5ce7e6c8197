//! Deterministic initialisation: a small seeded RNG and GPT-2's init rule.
//!
//! Every unit is initialised from its own stream (seed mixed with the unit index), so a rank
//! that holds only some units produces exactly the values a single process would.

use super::config::GptConfig;
use super::error::{GptError, Result};
use super::layout::{ParamLayout, UnitKind};
use super::split::{slice_part, TpSplit};

/// SplitMix64 (Steele, Lea, Flood 2014): 64 bits of state, passes BigCrush, and trivially
/// reproducible. Chosen over xorshift because any seed, zero included, is a good state.
#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// A generator whose stream is fixed by `seed`.
    #[must_use]
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1), 53 bits of precision.
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Standard normal by Box-Muller (one of the pair is dropped: simpler, and init speed does
    /// not matter). Computed in f64 and rounded to f32 by the caller, so last-ulp differences
    /// between platforms' `ln`/`cos` do not reach the f32 parameters in practice.
    pub fn normal(&mut self) -> f64 {
        // 1 - u is in (0, 1], so the log is finite.
        let u1 = 1.0 - self.uniform();
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

/// GPT-2's standard deviation for weights.
pub const INIT_STD: f64 = 0.02;

/// Fills one unit's parameter buffer with GPT-2's initialisation: normal(0, 0.02) for `wte`,
/// `wpe` and the block matrices, the residual projections (`attprojw`, `fcprojw`) scaled by
/// 1/sqrt(2L), biases 0, LayerNorm weights 1. The padded vocabulary rows of `wte` are zero
/// (they are never looked up and their logits are masked, so they stay zero in training
/// without weight decay's help).
///
/// # Errors
/// [`GptError::SizeMismatch`] if `unit` is not a unit index or `out` has the wrong length.
pub fn init_unit(
    config: &GptConfig,
    layout: &ParamLayout,
    unit: usize,
    seed: u64,
    out: &mut [f32],
) -> Result<()> {
    let spec = layout.units().get(unit).ok_or(GptError::SizeMismatch {
        what: "unit index (expected < num_units)",
        expected: layout.num_units(),
        got: unit,
    })?;
    if out.len() != spec.len {
        return Err(GptError::SizeMismatch {
            what: "unit parameter buffer",
            expected: spec.len,
            got: out.len(),
        });
    }
    // Mixing the unit index through one SplitMix step decorrelates neighbouring units' streams.
    let mut rng =
        Rng::new(Rng::new(seed ^ (unit as u64).wrapping_mul(0xA24B_AED4_963E_E407)).next_u64());
    let residual_scale = 1.0 / (2.0 * config.num_layers as f64).sqrt();
    for t in &spec.tensors {
        let view = &mut out[t.offset..t.offset + t.len];
        match t.name {
            "ln1w" | "ln2w" | "lnfw" => view.fill(1.0),
            "attprojw" | "fcprojw" => fill_normal(view, &mut rng, INIT_STD * residual_scale),
            "wte" => {
                let real = config.vocab_size * config.channels;
                fill_normal(&mut view[..real], &mut rng, INIT_STD);
                view[real..].fill(0.0);
            }
            "wpe" | "qkvw" | "fcw" => fill_normal(view, &mut rng, INIT_STD),
            _ => view.fill(0.0),
        }
    }
    Ok(())
}

/// Unit `unit` of rank `split.rank`'s layout `layout` ([`ParamLayout::split`]) initialised:
/// the whole unit made by [`init_unit`] from `seed` and its index at T = 1 (block `l`'s is
/// `l + 1`, the final norm's L+1, the embedding's 0), then sliced ([`slice_part`]); so
/// every T starts from
/// the same model to the bit. At T = 1, [`init_unit`] itself.
///
/// # Errors
/// As [`init_unit`]; a `split` that does not match `layout`.
pub fn init_split_unit(
    config: &GptConfig,
    layout: &ParamLayout,
    split: TpSplit,
    unit: usize,
    seed: u64,
    out: &mut [f32],
) -> Result<()> {
    if split.size != layout.tensor_parallel() {
        return Err(GptError::SizeMismatch {
            what: "tensor-parallel size of the layout",
            expected: layout.tensor_parallel(),
            got: split.size,
        });
    }
    if split.size == 1 {
        return init_unit(config, layout, unit, seed, out);
    }
    let spec = layout.units().get(unit).ok_or(GptError::SizeMismatch {
        what: "unit index (expected < num_units)",
        expected: layout.num_units(),
        got: unit,
    })?;
    let whole_layout = ParamLayout::new(config);
    let whole_unit = match spec.kind {
        UnitKind::Embedding | UnitKind::EmbeddingSlice | UnitKind::Positions => 0,
        UnitKind::FinalNorm => whole_layout.final_norm_unit(),
        UnitKind::Block { layer }
        | UnitKind::AttentionSlice { layer }
        | UnitKind::MlpSlice { layer }
        | UnitKind::BlockReplicated { layer } => ParamLayout::block_unit(layer),
    };
    let whole_spec = &whole_layout.units()[whole_unit];
    // Units of the whole layout are made as at T = 1; every other unit is cut from its
    // whole unit.
    if matches!(
        spec.kind,
        UnitKind::Embedding | UnitKind::Block { .. } | UnitKind::FinalNorm
    ) {
        return init_unit(config, &whole_layout, whole_unit, seed, out);
    }
    let mut whole = vec![0.0; whole_spec.len];
    init_unit(config, &whole_layout, whole_unit, seed, &mut whole)?;
    slice_part(config, split, whole_spec, &whole, spec, out)
}

/// Every unit initialised, one `Vec` per unit: a convenience for tests and single-process use.
#[must_use]
pub fn init_params(config: &GptConfig, layout: &ParamLayout, seed: u64) -> Vec<Vec<f32>> {
    (0..layout.num_units())
        .map(|unit| {
            let mut buf = vec![0.0; layout.units()[unit].len];
            // The index and length come from the same layout, so this cannot fail.
            if let Err(e) = init_unit(config, layout, unit, seed, &mut buf) {
                unreachable!("layout-derived unit rejected: {e}");
            }
            buf
        })
        .collect()
}

fn fill_normal(view: &mut [f32], rng: &mut Rng, std: f64) {
    for x in view {
        *x = (rng.normal() * std) as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_matches_the_reference_stream() {
        // First outputs of SplitMix64 seeded with 0 (the published reference values).
        let mut rng = Rng::new(0);
        assert_eq!(rng.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(rng.next_u64(), 0x6E78_9E6A_A1B9_65F4);
    }

    #[test]
    fn normal_has_unit_variance() {
        let mut rng = Rng::new(7);
        let n = 20_000;
        let xs: Vec<f64> = (0..n).map(|_| rng.normal()).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
        assert!(mean.abs() < 0.03, "{mean}");
        assert!((var - 1.0).abs() < 0.05, "{var}");
    }

    #[test]
    fn init_follows_gpt2_rules() {
        let cfg = GptConfig::tiny();
        let layout = ParamLayout::new(&cfg);
        let params = init_params(&cfg, &layout, 1);
        let block = &layout.units()[1];
        let get = |name: &str| {
            let t = block.tensor(name).unwrap();
            &params[1][t.offset..t.offset + t.len]
        };
        assert!(get("ln1w").iter().all(|&x| x == 1.0));
        assert!(get("qkvb").iter().all(|&x| x == 0.0));
        let std = |v: &[f32]| {
            (v.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>() / v.len() as f64).sqrt()
        };
        assert!((std(get("fcw")) - 0.02).abs() < 0.002);
        assert!(
            (std(get("fcprojw")) - 0.01).abs() < 0.001,
            "1/sqrt(2L) = 1/2 for L = 2"
        );
        let wte = &params[0][..cfg.padded_vocab_size * cfg.channels];
        assert!(wte[cfg.vocab_size * cfg.channels..]
            .iter()
            .all(|&x| x == 0.0));
    }

    #[test]
    fn same_seed_same_values_other_seed_other_values() {
        let cfg = GptConfig::tiny();
        let layout = ParamLayout::new(&cfg);
        assert_eq!(init_params(&cfg, &layout, 3), init_params(&cfg, &layout, 3));
        assert_ne!(init_params(&cfg, &layout, 3), init_params(&cfg, &layout, 4));
    }

    #[test]
    fn wrong_buffer_length_is_an_error() {
        let cfg = GptConfig::tiny();
        let layout = ParamLayout::new(&cfg);
        let mut buf = vec![0.0; 3];
        assert!(init_unit(&cfg, &layout, 0, 1, &mut buf).is_err());
        assert!(init_unit(&cfg, &layout, 99, 1, &mut buf).is_err());
    }
}
