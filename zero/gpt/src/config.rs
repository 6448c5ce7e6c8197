//! Model shape: `GptConfig`, its presets and its validation.
//!
//! Dimension legend used across `gpt`: B batch, T sequence length (T <= max_seq_len),
//! C channels, L layers, NH heads, hs = C / NH head size, V vocabulary, Vp padded vocabulary.

use super::error::{GptError, Result};

/// The GPT-2 vocabulary size (50,000 merges + 256 bytes + `<|endoftext|>`).
pub const GPT2_VOCAB_SIZE: usize = 50_257;

/// The padded vocabulary is a multiple of this, so the LM-head matmul has aligned rows.
pub const VOCAB_PAD_MULTIPLE: usize = 128;

/// Most layers or heads a model may have: far above any GPT-2 (48 layers, 25 heads), and low
/// enough that a model file's header cannot make the size table ([`crate::ParamLayout`], one
/// entry per layer) allocate without bound.
pub const MAX_LAYERS_OR_HEADS: usize = 1 << 10;

/// Shape of a GPT-2 style decoder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GptConfig {
    /// T max: the number of learned positions.
    pub max_seq_len: usize,
    /// V: token ids are `0..vocab_size`.
    pub vocab_size: usize,
    /// Vp: rows of the token embedding, `vocab_size` rounded up to a multiple of 128; the
    /// padded rows stay zero and their logits are masked out of the loss.
    pub padded_vocab_size: usize,
    /// L.
    pub num_layers: usize,
    /// NH.
    pub num_heads: usize,
    /// C.
    pub channels: usize,
}

/// Names accepted by [`GptConfig::preset`].
pub const PRESET_NAMES: &str = "tiny, small, gpt2, gpt2-medium, gpt2-large, gpt2-xl";

impl GptConfig {
    /// A config with `padded_vocab_size` derived from `vocab_size`, validated.
    ///
    /// # Errors
    /// [`GptError::InvalidConfig`] when a field is zero or `channels % num_heads != 0`.
    pub fn new(
        max_seq_len: usize,
        vocab_size: usize,
        num_layers: usize,
        num_heads: usize,
        channels: usize,
    ) -> Result<Self> {
        let config = Self {
            max_seq_len,
            vocab_size,
            padded_vocab_size: pad_vocab(vocab_size),
            num_layers,
            num_heads,
            channels,
        };
        config.validate()?;
        Ok(config)
    }

    /// For tests: L=2, NH=2, C=32, T=32 and a 100-token vocabulary (padded to 128, so the
    /// padded-logit masking is exercised).
    #[must_use]
    pub fn tiny() -> Self {
        Self::unchecked(32, 100, 2, 2, 32)
    }

    /// The default of `zero-train` on a 2-core CPU: L=4, NH=4, C=256, T=256, the GPT-2
    /// vocabulary (about 16.3M parameters, 13M of them in the tied embedding).
    #[must_use]
    pub fn small() -> Self {
        Self::unchecked(256, GPT2_VOCAB_SIZE, 4, 4, 256)
    }

    /// GPT-2 124M: L=12, NH=12, C=768, T=1024.
    #[must_use]
    pub fn gpt2() -> Self {
        Self::unchecked(1024, GPT2_VOCAB_SIZE, 12, 12, 768)
    }

    /// GPT-2 medium (350M): L=24, NH=16, C=1024, T=1024.
    #[must_use]
    pub fn gpt2_medium() -> Self {
        Self::unchecked(1024, GPT2_VOCAB_SIZE, 24, 16, 1024)
    }

    /// GPT-2 large (774M): L=36, NH=20, C=1280, T=1024.
    #[must_use]
    pub fn gpt2_large() -> Self {
        Self::unchecked(1024, GPT2_VOCAB_SIZE, 36, 20, 1280)
    }

    /// GPT-2 XL (1.5B): L=48, NH=25, C=1600, T=1024.
    #[must_use]
    pub fn gpt2_xl() -> Self {
        Self::unchecked(1024, GPT2_VOCAB_SIZE, 48, 25, 1600)
    }

    /// A preset by name (see [`PRESET_NAMES`]; `gpt2-124m` is accepted for `gpt2`).
    ///
    /// # Errors
    /// [`GptError::UnknownPreset`] for any other name.
    pub fn preset(name: &str) -> Result<Self> {
        match name {
            "tiny" => Ok(Self::tiny()),
            "small" => Ok(Self::small()),
            "gpt2" | "gpt2-124m" => Ok(Self::gpt2()),
            "gpt2-medium" => Ok(Self::gpt2_medium()),
            "gpt2-large" => Ok(Self::gpt2_large()),
            "gpt2-xl" => Ok(Self::gpt2_xl()),
            _ => Err(GptError::UnknownPreset {
                name: name.to_owned(),
                known: PRESET_NAMES,
            }),
        }
    }

    fn unchecked(
        max_seq_len: usize,
        vocab_size: usize,
        num_layers: usize,
        num_heads: usize,
        channels: usize,
    ) -> Self {
        Self {
            max_seq_len,
            vocab_size,
            padded_vocab_size: pad_vocab(vocab_size),
            num_layers,
            num_heads,
            channels,
        }
    }

    /// Checks every field; the model constructors call this, so a `Gpt` never holds a bad one.
    ///
    /// # Errors
    /// [`GptError::InvalidConfig`] naming the first bad field.
    pub fn validate(&self) -> Result<()> {
        let bad = |field, value, reason| {
            Err(GptError::InvalidConfig {
                field,
                value,
                reason,
            })
        };
        let positive = [
            ("max_seq_len", self.max_seq_len),
            ("vocab_size", self.vocab_size),
            ("num_layers", self.num_layers),
            ("num_heads", self.num_heads),
            ("channels", self.channels),
        ];
        for (field, value) in positive {
            if value == 0 {
                return bad(field, value, "must be at least 1");
            }
        }
        // The message states the bound, which this checks at compile time.
        const _: () = assert!(MAX_LAYERS_OR_HEADS == 1024);
        for (field, value) in [
            ("num_layers", self.num_layers),
            ("num_heads", self.num_heads),
        ] {
            if value > MAX_LAYERS_OR_HEADS {
                return bad(field, value, "must be at most 1024");
            }
        }
        // Token ids travel as u32 (and as u16 in llm.c token files); larger vocabularies would
        // silently wrap there.
        if self.vocab_size > u32::MAX as usize {
            return bad("vocab_size", self.vocab_size, "must fit in u32");
        }
        if self.channels % self.num_heads != 0 {
            return bad("channels", self.channels, "must be a multiple of num_heads");
        }
        if self.padded_vocab_size < self.vocab_size {
            return bad(
                "padded_vocab_size",
                self.padded_vocab_size,
                "must be >= vocab_size",
            );
        }
        if self.padded_vocab_size % VOCAB_PAD_MULTIPLE != 0 {
            return bad(
                "padded_vocab_size",
                self.padded_vocab_size,
                "must be a multiple of 128",
            );
        }
        // Guard the size table's arithmetic: the largest tensor (wte or an MLP matrix) and the
        // whole model must be countable in usize without overflow.
        let c = self.channels;
        let total = c
            .checked_mul(self.padded_vocab_size.max(self.max_seq_len).max(4 * c))
            .and_then(|x| x.checked_mul(self.num_layers + 2));
        if total.is_none() {
            return bad("channels", c, "model size overflows usize");
        }
        Ok(())
    }

    /// hs = C / NH.
    #[must_use]
    pub fn head_size(&self) -> usize {
        self.channels / self.num_heads
    }
}

/// `vocab_size` rounded up to a multiple of [`VOCAB_PAD_MULTIPLE`].
#[must_use]
pub fn pad_vocab(vocab_size: usize) -> usize {
    vocab_size.div_ceil(VOCAB_PAD_MULTIPLE) * VOCAB_PAD_MULTIPLE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preset_is_valid_and_pads_the_vocab() {
        for name in PRESET_NAMES.split(", ") {
            let cfg = GptConfig::preset(name).unwrap();
            cfg.validate().unwrap();
            assert_eq!(cfg.padded_vocab_size % 128, 0);
        }
        assert_eq!(GptConfig::gpt2().padded_vocab_size, 50_304);
    }

    #[test]
    fn heads_must_divide_channels() {
        let err = GptConfig::new(16, 10, 1, 3, 32).unwrap_err();
        assert!(
            matches!(
                err,
                GptError::InvalidConfig {
                    field: "channels",
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn zero_fields_are_rejected() {
        assert!(GptConfig::new(0, 10, 1, 1, 8).is_err());
        assert!(GptConfig::new(8, 0, 1, 1, 8).is_err());
        assert!(GptConfig::new(8, 10, 0, 1, 8).is_err());
        assert!(GptConfig::new(8, 10, 1, 0, 8).is_err());
    }

    #[test]
    fn unpadded_vocab_is_rejected() {
        let mut cfg = GptConfig::tiny();
        cfg.padded_vocab_size = 100;
        assert!(cfg.validate().is_err());
    }

    #[test]
    fn unknown_preset_names_the_known_ones() {
        let err = GptConfig::preset("gpt5").unwrap_err();
        assert!(err.to_string().contains("gpt2-xl"));
    }
}
