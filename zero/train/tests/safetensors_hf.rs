//! Hugging Face GPT-2 safetensors: export and import against independent readers and
//! writers written here (serde_json for the header, bytes by hand), and the errors.

mod common;
use common::model_units;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::json;
use zero_gpt::{GptConfig, ParamLayout};
use zero_train::checkpoint::{
    export_safetensors, read_safetensors, read_safetensors_bytes, write_hf_config, CheckpointError,
    LlmcCheckpoint, ModelShape, SafetensorsDtype, SafetensorsError,
};

/// HF's name of each block tensor, llm.c's name, and whether HF's Conv1D stores it (in, out).
const BLOCK: [(&str, &str, bool); 12] = [
    ("ln_1.weight", "ln1w", false),
    ("ln_1.bias", "ln1b", false),
    ("attn.c_attn.weight", "qkvw", true),
    ("attn.c_attn.bias", "qkvb", false),
    ("attn.c_proj.weight", "attprojw", true),
    ("attn.c_proj.bias", "attprojb", false),
    ("ln_2.weight", "ln2w", false),
    ("ln_2.bias", "ln2b", false),
    ("mlp.c_fc.weight", "fcw", true),
    ("mlp.c_fc.bias", "fcb", false),
    ("mlp.c_proj.weight", "fcprojw", true),
    ("mlp.c_proj.bias", "fcprojb", false),
];

/// llm.c's per-layer (rows, cols) of each block tensor (cols 1 for vectors), from train_gpt2.c.
fn llmc_block_shape(name: &str, c: usize) -> (usize, usize) {
    match name {
        "qkvw" => (3 * c, c),
        "qkvb" => (3 * c, 1),
        "attprojw" => (c, c),
        "fcw" => (4 * c, c),
        "fcb" => (4 * c, 1),
        "fcprojw" => (c, 4 * c),
        _ => (c, 1),
    }
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("zero-st-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// An independent safetensors reader: name -> (dtype, shape, raw bytes).
fn read_st(path: &Path) -> HashMap<String, (String, Vec<usize>, Vec<u8>)> {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let data = &bytes[8 + n..];
    let mut out = HashMap::new();
    for (name, v) in header.as_object().unwrap() {
        if name == "__metadata__" {
            assert_eq!(v["format"], "pt");
            continue;
        }
        let shape: Vec<usize> = serde_json::from_value(v["shape"].clone()).unwrap();
        let [b, e]: [usize; 2] = serde_json::from_value(v["data_offsets"].clone()).unwrap();
        out.insert(
            name.clone(),
            (
                v["dtype"].as_str().unwrap().to_string(),
                shape,
                data[b..e].to_vec(),
            ),
        );
    }
    out
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

/// An independent llm.c reader: header dims, then the sixteen tensors in file order.
fn read_llmc(path: &Path) -> HashMap<&'static str, Vec<f32>> {
    let bytes = std::fs::read(path).unwrap();
    let w = |i: usize| i32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().unwrap()) as usize;
    let (t, l, c, vp) = (w(2), w(4), w(6), w(7));
    let mut sizes = vec![("wte", vp * c), ("wpe", t * c)];
    for (_, name, _) in BLOCK {
        let (r, k) = llmc_block_shape(name, c);
        sizes.push((name, l * r * k));
    }
    sizes.extend([("lnfw", c), ("lnfb", c)]);
    let mut all = f32s(&bytes[1024..]).into_iter();
    sizes
        .into_iter()
        .map(|(n, len)| (n, all.by_ref().take(len).collect()))
        .collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn fp32_export_then_import_is_bit_exact_and_config_json_gives_the_heads() {
    let cfg = GptConfig::tiny();
    let dir = temp_dir("roundtrip");
    let path = dir.join("model.safetensors");
    let units = model_units(&cfg, 7);
    export_safetensors(&cfg, units.iter(), SafetensorsDtype::F32, &path).unwrap();
    write_hf_config(&cfg, SafetensorsDtype::F32, dir.join("config.json")).unwrap();
    let (got_cfg, got) = read_safetensors(&path, None).unwrap();
    assert_eq!(got_cfg, cfg);
    assert_eq!(got.len(), units.len());
    for (a, b) in got.iter().zip(&units) {
        assert_eq!(bits(a), bits(b));
    }
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["architectures"], json!(["GPT2LMHeadModel"]));
    assert_eq!(config["model_type"], "gpt2");
    let dims =
        ["n_embd", "n_layer", "n_head", "n_positions", "vocab_size"].map(|k| config[k].clone());
    assert_eq!(dims, [32, 2, 2, 32, 100].map(|v| json!(v)));
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn safetensors_export_equals_the_llmc_export_tensor_for_tensor() {
    let cfg = GptConfig::tiny(); // C = 32, L = 2, V = 100, Vp = 128, maxT = 32
    let (c, l, v) = (cfg.channels, cfg.num_layers, cfg.vocab_size);
    let dir = temp_dir("vs-llmc");
    let units = model_units(&cfg, 11);
    export_safetensors(
        &cfg,
        units.iter(),
        SafetensorsDtype::F32,
        dir.join("m.safetensors"),
    )
    .unwrap();
    LlmcCheckpoint::from_units(ModelShape::from_config(&cfg), &units)
        .unwrap()
        .save(dir.join("m.bin"))
        .unwrap();
    let st = read_st(&dir.join("m.safetensors"));
    let llmc = read_llmc(&dir.join("m.bin"));
    // wte without its padded rows, and no lm_head (tied).
    let expect = |name: &str, shape: Vec<usize>, want: &[f32]| {
        let (dtype, got_shape, raw) = &st[name];
        assert_eq!((dtype.as_str(), got_shape), ("F32", &shape), "{name}");
        assert_eq!(bits(&f32s(raw)), bits(want), "{name}");
    };
    expect("transformer.wte.weight", vec![v, c], &llmc["wte"][..v * c]);
    expect("transformer.wpe.weight", vec![32, c], &llmc["wpe"]);
    expect("transformer.ln_f.weight", vec![c], &llmc["lnfw"]);
    expect("transformer.ln_f.bias", vec![c], &llmc["lnfb"]);
    for layer in 0..l {
        for (hf, name, transposed) in BLOCK {
            let (r, k) = llmc_block_shape(name, c);
            let ours = &llmc[name][layer * r * k..(layer + 1) * r * k];
            let key = format!("transformer.h.{layer}.{hf}");
            if transposed {
                let t: Vec<f32> = (0..k * r).map(|x| ours[(x % r) * k + x / r]).collect();
                expect(&key, vec![k, r], &t);
            } else {
                expect(&key, vec![r], ours);
            }
        }
    }
    assert_eq!(st.len(), 4 + 12 * l);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn bf16_export_rounds_to_nearest_even_and_reads_back() {
    let cfg = GptConfig::tiny();
    let dir = temp_dir("bf16");
    let path = dir.join("m.safetensors");
    let units = model_units(&cfg, 3);
    export_safetensors(&cfg, units.iter(), SafetensorsDtype::Bf16, &path).unwrap();
    let st = read_st(&path);
    let (dtype, _, raw) = &st["transformer.wpe.weight"];
    assert_eq!(dtype, "BF16");
    let wpe = &units[0][cfg.padded_vocab_size * cfg.channels..];
    for (x, b) in wpe.iter().zip(raw.chunks_exact(2)) {
        let u = x.to_bits();
        let rounded = ((u + 0x7fff + ((u >> 16) & 1)) >> 16) as u16; // finite inputs only
        assert_eq!(u16::from_le_bytes([b[0], b[1]]), rounded, "{x}");
    }
    let (_, back) = read_safetensors(&path, Some(2)).unwrap();
    let err = back[0][..100]
        .iter()
        .zip(&units[0])
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(err <= 2f32.powi(-8) * 1.25, "{err}");
    std::fs::remove_dir_all(dir).unwrap();
}

/// An independent writer: tensors given as (name, dtype, shape, bytes), data in that order.
fn write_st(tensors: &[(String, &str, Vec<usize>, Vec<u8>)]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), json!({"format": "pt"}));
    let mut at = 0;
    for (name, dtype, shape, data) in tensors {
        header.insert(
            name.clone(),
            json!({"dtype": dtype, "shape": shape, "data_offsets": [at, at + data.len()]}),
        );
        at += data.len();
    }
    let text = serde_json::to_vec(&header).unwrap();
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend(text);
    tensors.iter().for_each(|t| out.extend(&t.3));
    out
}

/// A GPT-2 as HF's own `gpt2` file holds it: no prefix, with the attention mask buffers.
/// Element i of every tensor is `base + i`, so where each lands is visible.
fn hf_style(
    c: usize,
    l: usize,
    v: usize,
    t: usize,
) -> Vec<(String, &'static str, Vec<usize>, Vec<u8>)> {
    let le = |n: usize, base: usize| -> Vec<u8> {
        (0..n)
            .flat_map(|i| ((base + i) as f32).to_le_bytes())
            .collect()
    };
    let mut out = vec![
        ("wte.weight".to_string(), "F32", vec![v, c], le(v * c, 0)),
        ("wpe.weight".into(), "F32", vec![t, c], le(t * c, 0)),
        ("ln_f.weight".into(), "F32", vec![c], le(c, 0)),
        ("ln_f.bias".into(), "F32", vec![c], le(c, 0)),
    ];
    for layer in 0..l {
        out.push((
            format!("h.{layer}.attn.bias"),
            "F32",
            vec![1, 1, t, t],
            le(t * t, 0),
        ));
        out.push((
            format!("h.{layer}.attn.masked_bias"),
            "F32",
            vec![],
            le(1, 0),
        ));
        for (hf, name, transposed) in BLOCK {
            let (r, k) = llmc_block_shape(name, c);
            let shape = if transposed { vec![k, r] } else { vec![r] };
            out.push((
                format!("h.{layer}.{hf}"),
                "F32",
                shape,
                le(r * k, 1000 * layer),
            ));
        }
    }
    out
}

#[test]
fn hf_files_without_prefix_and_with_mask_buffers_are_read_and_transposed() {
    let (c, l, v, t) = (8, 2, 50, 16);
    let bytes = write_st(&hf_style(c, l, v, t));
    let (cfg, units) = read_safetensors_bytes(&bytes, 2).unwrap();
    assert_eq!(cfg, GptConfig::new(t, v, l, 2, c).unwrap());
    let ckpt = LlmcCheckpoint::from_units(ModelShape::from_config(&cfg), &units).unwrap();
    // llm.c's qkvw of layer 1 is (3C, C); HF's (C, 3C) element (i, j) = 1000 + i * 3C + j.
    let qkvw = ckpt.tensor("qkvw").unwrap();
    let layer1 = &qkvw[3 * c * c..];
    for (j, i) in [(0, 0), (5, 3), (3 * c - 1, c - 1)] {
        assert_eq!(layer1[j * c + i], (1000 + i * 3 * c + j) as f32);
    }
    let wte = ckpt.tensor("wte").unwrap();
    assert_eq!(wte[v * c - 1], (v * c - 1) as f32);
    assert!(
        wte[v * c..].iter().all(|&x| x == 0.0),
        "padded rows are zero"
    );
}

fn st_error(bytes: &[u8]) -> SafetensorsError {
    match read_safetensors_bytes(bytes, 2) {
        Err(CheckpointError::Safetensors { source, .. }) => source,
        other => panic!("expected a safetensors error, got {other:?}"),
    }
}

#[test]
fn a_missing_tensor_is_named() {
    let mut tensors = hf_style(8, 2, 50, 16);
    tensors.retain(|t| t.0 != "h.1.mlp.c_fc.bias");
    let err = st_error(&write_st(&tensors));
    assert_eq!(
        err,
        SafetensorsError::MissingTensor {
            tensor: "transformer.h.1.mlp.c_fc.bias".into()
        }
    );
}

#[test]
fn a_wrong_shape_is_named_with_both_shapes() {
    let mut tensors = hf_style(8, 2, 50, 16);
    let qkv = tensors
        .iter_mut()
        .find(|t| t.0 == "h.0.attn.c_attn.weight")
        .unwrap();
    qkv.2 = vec![24, 8]; // llm.c's orientation, not HF's
    let err = st_error(&write_st(&tensors));
    assert_eq!(
        err,
        SafetensorsError::WrongShape {
            tensor: "transformer.h.0.attn.c_attn.weight".into(),
            expected: vec![8, 24],
            got: vec![24, 8]
        }
    );
}

#[test]
fn an_unsupported_dtype_is_named() {
    let mut tensors = hf_style(8, 1, 50, 16);
    let ln = tensors.iter_mut().find(|t| t.0 == "h.0.ln_2.bias").unwrap();
    ln.1 = "I32";
    let err = st_error(&write_st(&tensors));
    assert_eq!(
        err,
        SafetensorsError::UnsupportedDtype {
            tensor: "h.0.ln_2.bias".into(),
            dtype: "I32".into()
        }
    );
}

#[test]
fn truncation_names_the_tensor_cut_short_and_corrupt_headers_are_refused() {
    let tensors = hf_style(8, 1, 50, 16);
    let last = tensors.last().unwrap().0.clone();
    let bytes = write_st(&tensors);
    let err = st_error(&bytes[..bytes.len() - 3]);
    assert!(
        matches!(&err, SafetensorsError::BadExtent { tensor, .. } if *tensor == last),
        "{err}"
    );
    assert!(matches!(
        st_error(&bytes[..5]),
        SafetensorsError::Truncated { .. }
    ));
    let mut garbage = bytes.clone();
    garbage[8] = b'[';
    assert!(matches!(
        st_error(&garbage),
        SafetensorsError::CorruptHeader { .. }
    ));
    let mut huge = bytes;
    huge[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(
        st_error(&huge),
        SafetensorsError::HeaderTooLarge { .. }
    ));
}

#[test]
fn overlapping_tensors_are_refused_before_allocating() {
    // Two tensors claiming the same bytes would let a small file ask for a large model.
    let mut bytes = write_st(&hf_style(8, 1, 50, 16));
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let text = String::from_utf8(bytes[8..8 + n].to_vec()).unwrap();
    let mut header: serde_json::Value = serde_json::from_str(&text).unwrap();
    header["wpe.weight"]["data_offsets"] = header["wte.weight"]["data_offsets"].clone();
    header["wpe.weight"]["shape"] = json!([50, 8]);
    let text = serde_json::to_vec(&header).unwrap();
    let data = bytes.split_off(8 + n);
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend(text);
    out.extend(data);
    assert!(matches!(st_error(&out), SafetensorsError::BadExtent { .. }));
}

#[test]
fn heads_come_from_the_caller_or_config_json_and_must_agree() {
    let cfg = GptConfig::tiny();
    let dir = temp_dir("heads");
    let path = dir.join("model.safetensors");
    export_safetensors(
        &cfg,
        model_units(&cfg, 1).iter(),
        SafetensorsDtype::F32,
        &path,
    )
    .unwrap();
    let err = read_safetensors(&path, None).unwrap_err();
    assert!(
        matches!(
            err,
            CheckpointError::Safetensors {
                source: SafetensorsError::MissingHeads,
                ..
            }
        ),
        "{err}"
    );
    let mut other = cfg;
    other.num_layers = 3;
    write_hf_config(&other, SafetensorsDtype::F32, dir.join("config.json")).unwrap();
    let err = read_safetensors(&path, None).unwrap_err();
    assert!(
        err.to_string().contains("n_layer is 3 but the model has 2"),
        "{err}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_wrong_unit_count_or_length_writes_nothing() {
    let cfg = GptConfig::tiny();
    let dir = temp_dir("units");
    let path = dir.join("model.safetensors");
    let mut units = model_units(&cfg, 1);
    units[2].pop();
    let err = export_safetensors(&cfg, units.iter(), SafetensorsDtype::F32, &path).unwrap_err();
    assert!(
        matches!(err, CheckpointError::ShapeMismatch { ref what, .. } if what == "unit 2"),
        "{err}"
    );
    units.truncate(2);
    let err = export_safetensors(&cfg, units.iter(), SafetensorsDtype::F32, &path).unwrap_err();
    assert!(
        matches!(
            err,
            CheckpointError::ShapeMismatch {
                expected: 4,
                got: 2,
                ..
            }
        ),
        "{err}"
    );
    assert!(!path.exists());
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        0,
        "no temporary left"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

    /// What the fuzz target checks, on a small budget in every test run: corrupted bytes
    /// anywhere (header length, JSON, data) and truncation give an error or a model, never a
    /// panic, and an accepted model has the layout's unit sizes.
    #[test]
    fn corrupted_files_never_panic(
        flips in proptest::collection::vec((0usize..4000, proptest::prelude::any::<u8>()), 1..4),
        cut in 0usize..64,
    ) {
        let mut bytes = write_st(&hf_style(4, 1, 6, 4));
        for (at, value) in flips {
            let at = at % bytes.len();
            bytes[at] = value;
        }
        bytes.truncate(bytes.len() - cut.min(bytes.len()));
        if let Ok((cfg, units)) = read_safetensors_bytes(&bytes, 2) {
            let lens: Vec<usize> = units.iter().map(Vec::len).collect();
            proptest::prop_assert_eq!(lens, ParamLayout::new(&cfg).unit_lens());
        }
    }
}
