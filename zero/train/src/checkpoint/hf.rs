//! The Hugging Face GPT-2 checkpoint's view of the model: tensor names, shapes, and the
//! `config.json` of `GPT2LMHeadModel`.
//!
//! Legend: C channels, L layers, V vocabulary, Vp padded vocabulary, maxT positions.
//!
//! Every tensor comes from the model's size table ([`ParamLayout`]); this file only names
//! them and states the two ways HF's layout differs:
//! - HF's `Conv1D` stores a linear layer's weight as (in, out); the model (like llm.c) keeps
//!   (out, in). Every 2-D tensor of a block is therefore transposed on the way out and in.
//! - The token embedding has V rows, not Vp: the padded rows are the model's own alignment.
//!   The LM head is tied to it, so HF's file has no `lm_head.weight` and neither does ours.

use serde_json::json;
use zero_gpt::{GptConfig, ParamLayout, UnitKind};

/// One tensor as HF stores it, and where its data lives in the unit buffers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HfTensor {
    /// HF's name, with the `transformer.` prefix of `GPT2LMHeadModel`.
    pub(crate) name: String,
    /// The unit holding it.
    pub(crate) unit: usize,
    /// First element inside the unit.
    pub(crate) offset: usize,
    /// The model's (rows, cols): (out, in) for a weight, (n, 1) for a vector.
    pub(crate) rows: usize,
    /// See `rows`.
    pub(crate) cols: usize,
    /// Stored in the file as (cols, rows).
    pub(crate) transposed: bool,
    /// HF's shape.
    pub(crate) shape: Vec<usize>,
}

impl HfTensor {
    /// Elements in the file.
    pub(crate) fn len(&self) -> usize {
        self.rows * self.cols
    }
}

/// HF's name of a block tensor (the model's names are llm.c's).
fn block_name(name: &str) -> Option<&'static str> {
    Some(match name {
        "ln1w" => "ln_1.weight",
        "ln1b" => "ln_1.bias",
        "qkvw" => "attn.c_attn.weight",
        "qkvb" => "attn.c_attn.bias",
        "attprojw" => "attn.c_proj.weight",
        "attprojb" => "attn.c_proj.bias",
        "ln2w" => "ln_2.weight",
        "ln2b" => "ln_2.bias",
        "fcw" => "mlp.c_fc.weight",
        "fcb" => "mlp.c_fc.bias",
        "fcprojw" => "mlp.c_proj.weight",
        "fcprojb" => "mlp.c_proj.bias",
        _ => return None,
    })
}

/// HF's name of an embedding or final-norm tensor.
fn outer_name(name: &str) -> Option<&'static str> {
    Some(match name {
        "wte" => "wte.weight",
        "wpe" => "wpe.weight",
        "lnfw" => "ln_f.weight",
        "lnfb" => "ln_f.bias",
        _ => return None,
    })
}

/// Every tensor of HF's GPT-2 file for `config` (validated), in unit order.
pub(crate) fn hf_tensors(config: &GptConfig) -> Vec<HfTensor> {
    let layout = ParamLayout::new(config);
    let mut out = Vec::new();
    for (unit, u) in layout.units().iter().enumerate() {
        for t in &u.tensors {
            let (rows, cols) = match t.shape[..] {
                [r, c] => (r, c),
                _ => (t.len, 1),
            };
            let (name, transposed, rows) = match u.kind {
                UnitKind::Block { layer } => {
                    let suffix = block_name(t.name).unwrap_or(t.name);
                    (format!("h.{layer}.{suffix}"), t.shape.len() == 2, rows)
                }
                // Only the first V rows of wte are the vocabulary.
                _ if t.name == "wte" => ("wte.weight".into(), false, config.vocab_size),
                _ => (outer_name(t.name).unwrap_or(t.name).into(), false, rows),
            };
            let shape = match (t.shape.len(), transposed) {
                (2, true) => vec![cols, rows],
                (2, false) => vec![rows, cols],
                _ => vec![rows],
            };
            out.push(HfTensor {
                name: format!("transformer.{name}"),
                unit,
                offset: t.offset,
                rows,
                cols,
                transposed,
                shape,
            });
        }
    }
    out
}

/// The `config.json` of HF's `GPT2LMHeadModel` for `config`; `torch_dtype` is the dtype
/// the weights were written in (`"float32"` or `"bfloat16"`).
///
/// GELU is the tanh approximation (`gelu_new`) and LayerNorm's epsilon 1e-5, as the model's
/// kernels compute them.
pub fn hf_config_json(config: &GptConfig, torch_dtype: &str) -> serde_json::Value {
    let mut v = json!({
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": config.vocab_size,
        "n_positions": config.max_seq_len,
        "n_ctx": config.max_seq_len,
        "n_embd": config.channels,
        "n_layer": config.num_layers,
        "n_head": config.num_heads,
        "n_inner": null,
        "activation_function": "gelu_new",
        "layer_norm_epsilon": 1e-5,
        "initializer_range": 0.02,
        "tie_word_embeddings": true,
        "torch_dtype": torch_dtype,
    });
    // GPT-2's <|endoftext|> is both; a smaller vocabulary has no such token.
    if config.vocab_size == zero_gpt::GPT2_VOCAB_SIZE {
        v["bos_token_id"] = json!(50_256);
        v["eos_token_id"] = json!(50_256);
    }
    v
}

/// The dimensions a `config.json` states, each optional.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct HfDims {
    pub(crate) n_head: Option<usize>,
    pub(crate) n_embd: Option<usize>,
    pub(crate) n_layer: Option<usize>,
    pub(crate) n_positions: Option<usize>,
    pub(crate) vocab_size: Option<usize>,
}

/// Reads the dimensions from a `config.json`'s text.
///
/// # Errors
/// The parser's message, or which field is not a non-negative integer.
pub(crate) fn parse_hf_dims(text: &[u8]) -> Result<HfDims, String> {
    let v: serde_json::Value = serde_json::from_slice(text).map_err(|e| e.to_string())?;
    let field = |name: &str| -> Result<Option<usize>, String> {
        match v.get(name) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(x) => x
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| format!("{name} is {x}, not a non-negative integer")),
        }
    };
    Ok(HfDims {
        n_head: field("n_head")?,
        n_embd: field("n_embd")?,
        n_layer: field("n_layer")?,
        n_positions: field("n_positions")?,
        vocab_size: field("vocab_size")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpt2_124m_has_hfs_parameter_count_and_no_lm_head() {
        let tensors = hf_tensors(&GptConfig::gpt2());
        // transformers' GPT2LMHeadModel("gpt2").num_parameters(): 124,439,808 (V = 50257 rows).
        assert_eq!(
            tensors.iter().map(HfTensor::len).sum::<usize>(),
            124_439_808
        );
        assert_eq!(tensors.len(), 4 + 12 * 12);
        assert!(tensors.iter().all(|t| t.name.starts_with("transformer.")));
        let qkv = tensors
            .iter()
            .find(|t| t.name == "transformer.h.11.attn.c_attn.weight");
        assert_eq!(qkv.map(|t| t.shape.clone()), Some(vec![768, 2304]));
    }

    #[test]
    fn config_json_dims_parse_back_and_bad_fields_are_named() {
        let text = hf_config_json(&GptConfig::gpt2_medium(), "float32").to_string();
        let dims = parse_hf_dims(text.as_bytes());
        assert_eq!(
            dims.map(|d| (d.n_head, d.n_layer, d.n_embd)),
            Ok((Some(16), Some(24), Some(1024)))
        );
        let err = parse_hf_dims(br#"{"n_head": -3}"#)
            .err()
            .unwrap_or_default();
        assert!(err.contains("n_head"), "{err}");
    }
}
