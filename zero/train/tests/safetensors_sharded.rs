//! Hugging Face's sharded safetensors (`model.safetensors.index.json` plus shard files): a
//! model exported as one file is cut into shards here, by hand (serde_json and byte copies,
//! no code of the crate's readers), and must read back as the units it was made from; an
//! index that disagrees with its shards is refused by name.

mod common;
use common::{model_units, TempDir};

use std::path::Path;

use serde_json::json;
use zero_gpt::GptConfig;
use zero_train::checkpoint::{
    export_safetensors, model_file_config, read_model_file, write_hf_config, CheckpointError,
    SafetensorsDtype, SafetensorsError,
};

/// The tensors of a one-file safetensors: (name, header entry without offsets, bytes).
fn tensors_of(path: &Path) -> Vec<(String, serde_json::Value, Vec<u8>)> {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let data = &bytes[8 + n..];
    let mut out: Vec<_> = header
        .as_object()
        .unwrap()
        .iter()
        .filter(|(name, _)| *name != "__metadata__")
        .map(|(name, v)| {
            let [b, e]: [usize; 2] = serde_json::from_value(v["data_offsets"].clone()).unwrap();
            let entry = json!({"dtype": v["dtype"], "shape": v["shape"]});
            (name.clone(), entry, data[b..e].to_vec())
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// Writes `tensors` as one safetensors file.
fn write_shard(path: &Path, tensors: &[&(String, serde_json::Value, Vec<u8>)]) {
    let mut header = serde_json::Map::new();
    let mut at = 0;
    for (name, entry, data) in tensors {
        let mut e = entry.clone();
        e["data_offsets"] = json!([at, at + data.len()]);
        header.insert(name.clone(), e);
        at += data.len();
    }
    let text = serde_json::to_vec(&header).unwrap();
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend(text);
    tensors.iter().for_each(|t| out.extend(&t.2));
    std::fs::write(path, out).unwrap();
}

/// The tiny model exported to `dir/whole.safetensors`, then cut into `shards` files in `dir`
/// (tensor k into shard k % shards) with HF's index and config.json; returns its units.
fn sharded_model(dir: &Path, shards: usize) -> (GptConfig, Vec<Vec<f32>>) {
    let cfg = GptConfig::tiny();
    let units = model_units(&cfg, 5);
    let whole = dir.join("whole.safetensors");
    export_safetensors(&cfg, units.iter(), SafetensorsDtype::F32, &whole).unwrap();
    write_hf_config(&cfg, SafetensorsDtype::F32, dir.join("config.json")).unwrap();
    let tensors = tensors_of(&whole);
    std::fs::remove_file(&whole).unwrap();
    let name = |s: usize| format!("model-{:05}-of-{shards:05}.safetensors", s + 1);
    let mut weight_map = serde_json::Map::new();
    for s in 0..shards {
        let mine: Vec<_> = tensors.iter().skip(s).step_by(shards).collect();
        write_shard(&dir.join(name(s)), &mine);
        for t in mine {
            weight_map.insert(t.0.clone(), json!(name(s)));
        }
    }
    let index = json!({"metadata": {"total_size": 0}, "weight_map": weight_map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    (cfg, units)
}

fn bits(units: &[Vec<f32>]) -> Vec<Vec<u32>> {
    units
        .iter()
        .map(|u| u.iter().map(|x| x.to_bits()).collect())
        .collect()
}

fn edit_index(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join("model.safetensors.index.json");
    let mut index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    edit(&mut index);
    std::fs::write(path, index.to_string()).unwrap();
}

fn index_error(dir: &Path) -> String {
    match read_model_file(&dir.join("model.safetensors.index.json"), None) {
        Err(CheckpointError::Safetensors {
            source: SafetensorsError::BadIndex { reason },
            ..
        }) => reason,
        other => panic!("expected a bad index, got {other:?}"),
    }
}

#[test]
fn a_sharded_checkpoint_reads_back_bit_exact_from_its_index_or_its_folder() {
    for shards in [1, 2, 3] {
        let dir = TempDir::new(&format!("sharded-{shards}"));
        let (cfg, units) = sharded_model(&dir.0, shards);
        let index = dir.0.join("model.safetensors.index.json");
        for path in [index.as_path(), dir.0.as_path()] {
            let (got_cfg, got) = read_model_file(path, None).unwrap();
            assert_eq!(got_cfg, cfg, "{shards} shards from {}", path.display());
            assert_eq!(bits(&got), bits(&units), "{shards} shards");
            assert_eq!(model_file_config(path, None).unwrap(), cfg);
        }
    }
}

#[test]
fn an_index_that_disagrees_with_its_shards_is_refused_by_name() {
    let dir = TempDir::new("sharded-bad");
    sharded_model(&dir.0, 2);
    let first = "model-00001-of-00002.safetensors";
    let second = "model-00002-of-00002.safetensors";
    let tensor = "transformer.wte.weight";
    // Mapped to the other shard: the shard that holds it says so.
    edit_index(&dir.0, |i| {
        let home = i["weight_map"][tensor].as_str().unwrap().to_string();
        let other = if home == first { second } else { first };
        i["weight_map"][tensor] = json!(other);
    });
    let why = index_error(&dir.0);
    assert!(why.contains(tensor), "{why}");
    // Not mapped at all.
    edit_index(&dir.0, |i| {
        i["weight_map"].as_object_mut().unwrap().remove(tensor);
    });
    assert!(index_error(&dir.0).contains("maps nowhere"));
    // A shard outside the folder.
    edit_index(&dir.0, |i| {
        i["weight_map"][tensor] = json!("../escape.safetensors")
    });
    assert!(index_error(&dir.0).contains("not a file name"));
    // Not an index.
    std::fs::write(dir.0.join("model.safetensors.index.json"), "[1, 2]").unwrap();
    assert!(index_error(&dir.0).contains("weight_map"));
}

#[test]
fn a_missing_shard_names_the_shard_file() {
    let dir = TempDir::new("sharded-missing");
    sharded_model(&dir.0, 2);
    let gone = dir.0.join("model-00002-of-00002.safetensors");
    std::fs::remove_file(&gone).unwrap();
    match read_model_file(&dir.0, None) {
        Err(CheckpointError::Io(e)) => assert!(e.to_string().contains("model-00002-of-00002")),
        other => panic!("expected an I/O error naming the shard, got {other:?}"),
    }
}

#[test]
fn a_folder_without_a_model_is_refused_by_name() {
    let dir = TempDir::new("sharded-empty");
    assert!(matches!(
        read_model_file(&dir.0, None),
        Err(CheckpointError::NoModelInFolder { .. })
    ));
}

#[test]
fn export_converts_a_sharded_hugging_face_folder_to_llmc_bit_exact() {
    use zero_train::checkpoint::export::{export, ExportArgs, ExportDtype, ExportFormat};
    use zero_train::checkpoint::LlmcCheckpoint;
    let dir = TempDir::new("sharded-export");
    let (cfg, units) = sharded_model(&dir.0, 2);
    let to = dir.0.join("out").join("model.bin");
    let args = ExportArgs {
        from: dir.0.clone(),
        to: to.clone(),
        format: ExportFormat::Llmc,
        dtype: ExportDtype::Fp32,
        heads: None,
        max_shard_size: None,
    };
    assert_eq!(export(&args).unwrap(), cfg);
    let written = LlmcCheckpoint::load(&to).unwrap();
    assert_eq!(bits(&written.to_units().unwrap()), bits(&units));
}

/// `export --max-shard-size` writes Hugging Face's sharded layout: every tensor of the
/// one-file export, byte for byte, in exactly one shard named in HF's way; shards within the
/// bound (or one tensor alone); an index whose weight map and total size say so; and the
/// folder reads back as the units exported.
#[test]
fn export_writes_hugging_faces_sharded_layout() {
    use zero_train::checkpoint::export::{export, ExportArgs, ExportDtype, ExportFormat};
    let dir = TempDir::new("sharded-out");
    let cfg = GptConfig::tiny();
    let units = model_units(&cfg, 9);
    let whole = dir.0.join("whole.safetensors");
    export_safetensors(&cfg, units.iter(), SafetensorsDtype::F32, &whole).unwrap();
    write_hf_config(&cfg, SafetensorsDtype::F32, dir.0.join("config.json")).unwrap();
    let max = 16 << 10;
    let out = dir.0.join("out");
    let args = ExportArgs {
        from: whole.clone(),
        to: out.clone(),
        format: ExportFormat::Safetensors,
        dtype: ExportDtype::Fp32,
        heads: None,
        max_shard_size: Some(zero_train::ByteSize(max)),
    };
    assert_eq!(export(&args).unwrap(), cfg);
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("model.safetensors.index.json")).unwrap())
            .unwrap();
    let map = index["weight_map"].as_object().unwrap();
    let shards: std::collections::BTreeSet<&str> =
        map.values().filter_map(|v| v.as_str()).collect();
    let n = shards.len();
    assert!(n > 2, "{n} shards");
    let mut seen = Vec::new();
    for (i, shard) in shards.iter().enumerate() {
        assert_eq!(*shard, format!("model-{:05}-of-{n:05}.safetensors", i + 1));
        let tensors = tensors_of(&out.join(shard));
        let bytes: usize = tensors.iter().map(|t| t.2.len()).sum();
        assert!(
            bytes as u64 <= max || tensors.len() == 1,
            "{shard}: {bytes} bytes"
        );
        for t in tensors {
            assert_eq!(map[&t.0], json!(shard), "{}", t.0);
            seen.push(t);
        }
    }
    seen.sort_by(|a, b| a.0.cmp(&b.0));
    let reference = tensors_of(&whole);
    assert!(
        seen == reference,
        "the shards hold the one-file export's tensors"
    );
    let total: usize = reference.iter().map(|t| t.2.len()).sum();
    assert_eq!(index["metadata"]["total_size"], json!(total));
    let (got_cfg, got) = read_model_file(&out, None).unwrap();
    assert_eq!((got_cfg, bits(&got)), (cfg, bits(&units)));
    // A second export into the folder is refused by name, and the first stays as it was
    // (a reader would otherwise take the old index for the new shards).
    let again = ExportArgs {
        max_shard_size: Some(zero_train::ByteSize(1 << 30)),
        ..args
    };
    let err = export(&again).unwrap_err().to_string();
    assert!(err.contains("already holds a Hugging Face model"), "{err}");
    assert!(!out.join("model.safetensors").exists());
    let (_, still) = read_model_file(&out, None).unwrap();
    assert_eq!(bits(&still), bits(&units));
}

/// One unit short, the sharded export fails naming the unit count and leaves no shard;
/// `--format llmc` and a file as `--to` are refused with `--max-shard-size`.
#[test]
fn a_failed_sharded_export_leaves_nothing_and_wrong_flags_are_refused() {
    use zero_train::checkpoint::export::{export, ExportArgs, ExportDtype, ExportFormat};
    use zero_train::checkpoint::export_sharded_safetensors;
    let dir = TempDir::new("sharded-fail");
    let cfg = GptConfig::tiny();
    let units = model_units(&cfg, 3);
    let out = dir.0.join("out");
    let short = &units[..units.len() - 1];
    let err = export_sharded_safetensors(&cfg, short.iter(), SafetensorsDtype::F32, &out, 4096)
        .unwrap_err();
    assert!(
        matches!(err, CheckpointError::ShapeMismatch { .. }),
        "{err}"
    );
    assert_eq!(
        std::fs::read_dir(&out).unwrap().count(),
        0,
        "shards left behind"
    );
    let whole = dir.0.join("whole.safetensors");
    export_safetensors(&cfg, units.iter(), SafetensorsDtype::F32, &whole).unwrap();
    let args = |format, to: &Path| ExportArgs {
        from: whole.clone(),
        to: to.to_path_buf(),
        format,
        dtype: ExportDtype::Fp32,
        heads: Some(cfg.num_heads),
        max_shard_size: Some(zero_train::ByteSize(4096)),
    };
    let llmc = export(&args(ExportFormat::Llmc, &out))
        .unwrap_err()
        .to_string();
    assert!(llmc.contains("--max-shard-size"), "{llmc}");
    let file = export(&args(ExportFormat::Safetensors, &whole))
        .unwrap_err()
        .to_string();
    assert!(file.contains("is a file"), "{file}");
}

proptest::proptest! {
    /// Any weight map of plain shard names survives serde_json and `parse_hf_index` unchanged;
    /// one name with a path separator makes the whole index refused.
    #[test]
    fn index_parsing_keeps_plain_maps_and_refuses_any_path(
        map in proptest::collection::hash_map("[a-z._]{1,12}", "[a-z0-9-]{1,10}\\.safetensors", 0..8),
        bad in "[a-z]{1,4}/[a-z]{1,4}",
    ) {
        use zero_train::checkpoint::parse_hf_index;
        let text = json!({"metadata": {"total_size": 1}, "weight_map": map}).to_string();
        proptest::prop_assert_eq!(parse_hf_index(text.as_bytes()).unwrap(), map.clone());
        let mut with_path = map;
        with_path.insert("x.weight".into(), bad);
        let text = json!({"weight_map": with_path}).to_string();
        let refused = matches!(
            parse_hf_index(text.as_bytes()),
            Err(SafetensorsError::BadIndex { .. })
        );
        proptest::prop_assert!(refused, "an index with a path was accepted");
    }
}
