//! Training-state directories: bit-exact round trips and detection of damage.

use std::path::{Path, PathBuf};

use half::bf16;
use proptest::prelude::*;
use serde_json::json;
use zero_train::checkpoint::{Error, StateReader, StateWriter};

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("zero-state-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn save_sample(dir: &Path) {
    let mut w = StateWriter::create(dir).unwrap();
    w.write(
        "model/unit0",
        &[
            1.0f32,
            -0.0,
            f32::MIN_POSITIVE / 2.0,
            f32::from_bits(0x7fc0_1234),
        ],
    )
    .unwrap();
    w.write("rank0/adam_m/unit0", &[0.5f32; 3]).unwrap();
    w.write(
        "model_bf16/unit0",
        &[bf16::from_f32(1.5), bf16::from_f32(-2.0)],
    )
    .unwrap();
    w.finish(
        42,
        json!({"loader": {"global_step": 42}, "rng": [1u64, u64::MAX]}),
    )
    .unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn arbitrary_tensors_round_trip_bit_exactly(
        tensors in prop::collection::vec(prop::collection::vec(any::<u32>(), 0..300), 1..5),
        step in any::<u64>(),
    ) {
        let root = temp_dir("prop");
        let dir = root.join("state");
        let mut w = StateWriter::create(&dir).unwrap();
        for (i, bits) in tensors.iter().enumerate() {
            let data: Vec<f32> = bits.iter().map(|&b| f32::from_bits(b)).collect();
            w.write(&format!("t{i}"), &data).unwrap();
        }
        w.finish(step, json!({})).unwrap();
        let mut r = StateReader::open(&dir).unwrap();
        prop_assert_eq!(r.step(), step);
        for (i, bits) in tensors.iter().enumerate() {
            let back: Vec<u32> = r.read::<f32>(&format!("t{i}")).unwrap().iter().map(|x| x.to_bits()).collect();
            prop_assert_eq!(&back, bits);
        }
        std::fs::remove_dir_all(root).unwrap();
    }
}

#[test]
fn sample_state_round_trips_with_meta_and_dtypes() {
    let root = temp_dir("sample");
    let dir = root.join("step_42");
    save_sample(&dir);
    let mut r = StateReader::open(&dir).unwrap();
    assert_eq!(r.step(), 42);
    assert_eq!(r.meta()["rng"][1], json!(u64::MAX));
    assert_eq!(
        r.names().collect::<Vec<_>>(),
        ["model/unit0", "rank0/adam_m/unit0", "model_bf16/unit0"]
    );
    let m0 = r.read::<f32>("model/unit0").unwrap();
    assert_eq!(m0[1].to_bits(), (-0.0f32).to_bits());
    assert_eq!(m0[3].to_bits(), 0x7fc0_1234, "NaN payload kept");
    assert_eq!(
        r.read::<bf16>("model_bf16/unit0").unwrap(),
        vec![bf16::from_f32(1.5), bf16::from_f32(-2.0)]
    );
    assert_eq!(r.describe("rank0/adam_m/unit0"), Some((3, "f32")));
    std::fs::remove_dir_all(root).unwrap();
}

#[test]
fn saving_again_replaces_the_state_and_leaves_no_staging() {
    let root = temp_dir("replace");
    let dir = root.join("latest");
    save_sample(&dir);
    let mut w = StateWriter::create(&dir).unwrap();
    w.write("only", &[7.0f32]).unwrap();
    w.finish(43, json!(null)).unwrap();
    let mut r = StateReader::open(&dir).unwrap();
    assert_eq!(r.step(), 43);
    assert_eq!(r.read::<f32>("only").unwrap(), vec![7.0]);
    assert!(r.describe("model/unit0").is_none());
    let entries: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(entries, ["latest"]);
    std::fs::remove_dir_all(root).unwrap();
}

#[test]
fn a_flipped_byte_is_a_checksum_mismatch_naming_the_tensor() {
    let root = temp_dir("flip");
    let dir = root.join("s");
    save_sample(&dir);
    let data = dir.join("tensors.bin");
    let mut bytes = std::fs::read(&data).unwrap();
    bytes[17] ^= 1; // inside rank0/adam_m/unit0 (bytes 16..28)
    std::fs::write(&data, bytes).unwrap();
    let mut r = StateReader::open(&dir).unwrap();
    assert!(r.read::<f32>("model/unit0").is_ok());
    let err = r.read::<f32>("rank0/adam_m/unit0").unwrap_err();
    assert!(
        matches!(&err, Error::ChecksumMismatch { name, .. } if name == "rank0/adam_m/unit0"),
        "{err:?}"
    );
    std::fs::remove_dir_all(root).unwrap();
}

#[test]
fn a_truncated_data_file_is_refused_on_open() {
    let root = temp_dir("trunc");
    let dir = root.join("s");
    save_sample(&dir);
    let data = dir.join("tensors.bin");
    let bytes = std::fs::read(&data).unwrap();
    std::fs::write(&data, &bytes[..bytes.len() - 1]).unwrap();
    assert!(matches!(
        StateReader::open(&dir),
        Err(Error::BadState { .. })
    ));
    std::fs::remove_dir_all(root).unwrap();
}

#[test]
fn manifest_damage_is_refused() {
    let root = temp_dir("manifest");
    let dir = root.join("s");
    save_sample(&dir);
    let path = dir.join("manifest.json");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.replace("\"version\": 1", "\"version\": 9")).unwrap();
    let err = StateReader::open(&dir).unwrap_err();
    assert!(
        matches!(&err, Error::BadState { reason, .. } if reason.contains("version 9")),
        "{err:?}"
    );
    std::fs::write(&path, text.replace("\"offset\": 16", "\"offset\": 12")).unwrap();
    assert!(matches!(
        StateReader::open(&dir),
        Err(Error::BadState { .. })
    ));
    std::fs::write(&path, &text[..text.len() / 2]).unwrap();
    assert!(matches!(StateReader::open(&dir), Err(Error::Json { .. })));
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(matches!(StateReader::open(&dir), Err(Error::Io { .. })));
    std::fs::remove_dir_all(root).unwrap();
}

#[test]
fn wrong_requests_are_tensor_errors() {
    let root = temp_dir("requests");
    let dir = root.join("s");
    save_sample(&dir);
    let mut r = StateReader::open(&dir).unwrap();
    assert!(matches!(r.read::<f32>("absent"), Err(Error::Tensor { .. })));
    assert!(matches!(
        r.read::<bf16>("model/unit0"),
        Err(Error::Tensor { .. })
    ));
    let mut short = [0.0f32; 2];
    assert!(matches!(
        r.read_into("model/unit0", &mut short),
        Err(Error::Tensor { .. })
    ));
    let mut w = StateWriter::create(root.join("dup")).unwrap();
    w.write("a", &[1.0f32]).unwrap();
    assert!(matches!(w.write("a", &[1.0f32]), Err(Error::Tensor { .. })));
    std::fs::remove_dir_all(root).unwrap();
}
