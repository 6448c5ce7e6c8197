//! llm.c checkpoints: round trips, the per-unit layout, and corrupt files.

use std::path::PathBuf;

use proptest::prelude::*;
use zero_train::checkpoint::{
    CheckpointError, LlmcCheckpoint, LlmcFormatError, ModelShape, LLMC_HEADER_BYTES,
};
use zero_train::error::IoError;

fn tiny() -> ModelShape {
    ModelShape {
        max_t: 4,
        vocab: 5,
        padded_vocab: 128,
        layers: 2,
        heads: 2,
        channels: 4,
    }
}

fn counting(shape: ModelShape) -> LlmcCheckpoint {
    let params = (0..shape.num_params()).map(|i| i as f32).collect();
    LlmcCheckpoint::from_flat(shape, params).unwrap()
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("zero-llmc-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn format_error(err: CheckpointError) -> LlmcFormatError {
    match err {
        CheckpointError::Format { source, .. } => source,
        other => panic!("expected a format error, got {other:?}"),
    }
}

fn header_with(words: &[(usize, i32)]) -> Vec<u8> {
    let mut bytes = counting(tiny()).to_bytes();
    for &(i, v) in words {
        bytes[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes());
    }
    bytes
}

fn shapes() -> impl Strategy<Value = ModelShape> {
    (
        1usize..6,
        1usize..7,
        0usize..2,
        1usize..4,
        1usize..3,
        1usize..4,
    )
        .prop_map(|(max_t, vocab, pad, layers, heads, hd)| ModelShape {
            max_t,
            vocab,
            padded_vocab: 128 * (1 + pad),
            layers,
            heads,
            channels: heads * hd,
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    fn bytes_and_stream_round_trip_bit_exactly(shape in shapes(), seed in any::<u32>()) {
        // Arbitrary bit patterns, NaNs included: the format must not touch them.
        let params: Vec<f32> = (0..shape.num_params() as u32).map(|i| f32::from_bits(i.wrapping_mul(2_654_435_761) ^ seed)).collect();
        let ckpt = LlmcCheckpoint::from_flat(shape, params.clone()).unwrap();
        let bytes = ckpt.to_bytes();
        let bits = |c: &LlmcCheckpoint| c.params().iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let want: Vec<u32> = params.iter().map(|x| x.to_bits()).collect();
        prop_assert_eq!(bits(&LlmcCheckpoint::from_bytes(&bytes).unwrap()), want.clone());
        prop_assert_eq!(bits(&LlmcCheckpoint::read_from(&bytes[..]).unwrap()), want);
    }

    #[test]
    fn units_round_trip(shape in shapes()) {
        let ckpt = counting(shape);
        let units = ckpt.to_units().unwrap();
        prop_assert_eq!(units.iter().map(Vec::len).collect::<Vec<_>>(), shape.unit_sizes());
        prop_assert_eq!(units.iter().map(Vec::len).sum::<usize>(), shape.num_params());
        prop_assert_eq!(LlmcCheckpoint::from_units(shape, &units).unwrap(), ckpt);
    }

    #[test]
    fn truncation_anywhere_is_an_error(cut in 1usize..2000) {
        let bytes = counting(tiny()).to_bytes();
        let keep = bytes.len().saturating_sub(cut);
        prop_assert!(LlmcCheckpoint::from_bytes(&bytes[..keep]).is_err());
        prop_assert!(LlmcCheckpoint::read_from(&bytes[..keep]).is_err());
    }
}

#[test]
fn gpt2_124m_has_llmc_parameter_count() {
    let shape = ModelShape {
        max_t: 1024,
        vocab: 50_257,
        padded_vocab: 50_304,
        layers: 12,
        heads: 12,
        channels: 768,
    };
    // The count llm.c's train_gpt2 prints for gpt2_124M.bin.
    assert_eq!(shape.num_params(), 124_475_904);
    let sizes = shape.unit_sizes();
    assert_eq!(sizes.len(), 14);
    assert_eq!(sizes[0], (50_304 + 1024) * 768);
    assert_eq!(sizes[1], 12 * 768 * 768 + 13 * 768);
    assert_eq!(sizes[13], 2 * 768);
}

#[test]
fn units_interleave_layers_of_llmc_tensors() {
    let s = tiny(); // C = 4, L = 2, Vp = 128, maxT = 4
    let ckpt = counting(s);
    let units = ckpt.to_units().unwrap();
    let ln1w = ckpt.tensor("ln1w").unwrap(); // (L, C)
    let qkvw = ckpt.tensor("qkvw").unwrap(); // (L, 3C, C)
                                             // Unit 2 (layer 1) starts with layer 1's ln1w, then ln1b, then layer 1's qkvw.
    assert_eq!(&units[2][..4], &ln1w[4..8]);
    assert_eq!(&units[2][8..8 + 48], &qkvw[48..96]);
    assert_eq!(&units[0][..], &ckpt.params()[..(128 + 4) * 4]);
    assert_eq!(&units[3][..], &ckpt.params()[s.num_params() - 8..]);
    assert_eq!(ckpt.tensor("lnfb").unwrap(), &units[3][4..]);
    assert!(ckpt.tensor("nope").is_none());
}

/// llm.c's sixteen tensors in file order, and which are matrices that training decays:
/// the token embedding (also the LM head) and the four projections. The position embedding
/// is 2-D but is not decayed (`zero_gpt::decays`, minGPT's rule).
const LLMC_TENSORS: [(&str, bool); 16] = [
    ("wte", true),
    ("wpe", false),
    ("ln1w", false),
    ("ln1b", false),
    ("qkvw", true),
    ("qkvb", false),
    ("attprojw", true),
    ("attprojb", false),
    ("ln2w", false),
    ("ln2b", false),
    ("fcw", true),
    ("fcb", false),
    ("fcprojw", true),
    ("fcprojb", false),
    ("lnfw", false),
    ("lnfb", false),
];

#[test]
fn llmc_order_is_llmcs_and_decay_is_what_training_applies() {
    let s = tiny();
    let names: Vec<&str> = s.llmc_tensors().iter().map(|t| t.name).collect();
    let want: Vec<&str> = LLMC_TENSORS.iter().map(|(n, _)| *n).collect();
    assert_eq!(names, want);
    // The flags training uses: the engine's decay shards come from these (bridge::gpt_units).
    let layout = s.layout();
    for (name, decayed) in LLMC_TENSORS {
        let flag = layout
            .units()
            .iter()
            .flat_map(|u| &u.tensors)
            .find(|t| t.name == name)
            .map(|t| t.weight_decay);
        assert_eq!(flag, Some(decayed), "{name}");
    }
}

#[test]
fn llmc_shapes_carry_the_layer_dimension() {
    let s = tiny(); // C = 4, L = 2, Vp = 128, maxT = 4
    let shapes: Vec<Vec<usize>> = s.llmc_tensors().into_iter().map(|t| t.shape).collect();
    let (l, c, vp, t) = (2, 4, 128, 4);
    let want = [
        vec![vp, c],
        vec![t, c],
        vec![l, c],
        vec![l, c],
        vec![l, 3 * c, c],
        vec![l, 3 * c],
        vec![l, c, c],
        vec![l, c],
        vec![l, c],
        vec![l, c],
        vec![l, 4 * c, c],
        vec![l, 4 * c],
        vec![l, c, 4 * c],
        vec![l, c],
        vec![c],
        vec![c],
    ];
    assert_eq!(shapes, want);
}

#[test]
fn wrong_unit_sizes_are_refused() {
    let s = tiny();
    let mut units = counting(s).to_units().unwrap();
    units[1].pop();
    assert!(matches!(
        LlmcCheckpoint::from_units(s, &units),
        Err(CheckpointError::ShapeMismatch { .. })
    ));
    units.pop();
    assert!(matches!(
        LlmcCheckpoint::from_units(s, &units),
        Err(CheckpointError::ShapeMismatch { .. })
    ));
}

#[test]
fn file_round_trip_and_missing_file() {
    let dir = temp_dir("file");
    let path = dir.join("model.bin");
    let ckpt = counting(tiny());
    ckpt.save(&path).unwrap();
    assert_eq!(LlmcCheckpoint::load(&path).unwrap(), ckpt);
    assert!(matches!(
        LlmcCheckpoint::load(dir.join("absent.bin")),
        Err(CheckpointError::Io(IoError { op: "open", .. }))
    ));
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn truncated_file_names_the_file() {
    let dir = temp_dir("trunc");
    let path = dir.join("cut.bin");
    let bytes = counting(tiny()).to_bytes();
    std::fs::write(&path, &bytes[..bytes.len() - 4]).unwrap();
    let err = LlmcCheckpoint::load(&path).unwrap_err();
    assert!(err.to_string().contains("cut.bin"), "{err}");
    assert!(matches!(
        format_error(err),
        LlmcFormatError::LengthMismatch { .. }
    ));
    std::fs::write(&path, &bytes[..100]).unwrap();
    let err = format_error(LlmcCheckpoint::load(&path).unwrap_err());
    assert_eq!(
        err,
        LlmcFormatError::TruncatedHeader {
            expected: LLMC_HEADER_BYTES,
            got: 100
        }
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn foreign_and_other_version_files_are_refused() {
    let err =
        format_error(LlmcCheckpoint::from_bytes(&header_with(&[(0, 20_240_520)])).unwrap_err());
    assert!(matches!(
        err,
        LlmcFormatError::BadMagic {
            found: 20_240_520,
            ..
        }
    ));
    let err = format_error(LlmcCheckpoint::from_bytes(&header_with(&[(1, 5)])).unwrap_err());
    assert_eq!(
        err,
        LlmcFormatError::BadVersion {
            supported: 3,
            found: 5
        }
    );
}

#[test]
fn invalid_dimensions_are_refused() {
    let cases: [(&[(usize, i32)], LlmcFormatError); 4] = [
        (
            &[(4, 0)],
            LlmcFormatError::BadDimension {
                field: "layers",
                value: 0,
            },
        ),
        (
            &[(6, -4)],
            LlmcFormatError::BadDimension {
                field: "channels",
                value: -4,
            },
        ),
        (
            &[(5, 3)],
            LlmcFormatError::InvalidModel {
                field: "channels",
                value: 4,
                reason: "must be a multiple of num_heads",
            },
        ),
        (
            &[(7, 4)],
            LlmcFormatError::InvalidModel {
                field: "padded_vocab_size",
                value: 4,
                reason: "must be >= vocab_size",
            },
        ),
    ];
    for (words, want) in cases {
        assert_eq!(
            format_error(LlmcCheckpoint::from_bytes(&header_with(words)).unwrap_err()),
            want
        );
    }
}

/// A header with 2^30 layers (or heads) and C = 1 describes a model whose size table alone
/// would take 51 GB: refused by the model's bound on layers and heads, on both entry points,
/// before anything is built (without the bound this test aborts on the allocation).
#[test]
fn a_forged_layer_or_head_count_is_refused_before_the_size_table_is_built() {
    for (word, field) in [(4, "num_layers"), (5, "num_heads")] {
        let forged = header_with(&[(4, 1), (5, 1), (6, 1), (word, 1 << 30)]);
        for err in [
            LlmcCheckpoint::from_bytes(&forged).unwrap_err(),
            LlmcCheckpoint::read_from(&forged[..]).unwrap_err(),
        ] {
            assert_eq!(
                format_error(err),
                LlmcFormatError::InvalidModel {
                    field,
                    value: 1 << 30,
                    reason: "must be at most 1024",
                }
            );
        }
    }
}

#[test]
fn absurd_sizes_fail_before_allocating() {
    // C = 2^31 - 1 (NH = 1 divides it): the model's own guard refuses 4 C^2 (L + 2).
    let overflow = header_with(&[(5, 1), (6, i32::MAX)]);
    assert!(matches!(
        format_error(LlmcCheckpoint::from_bytes(&overflow).unwrap_err()),
        LlmcFormatError::InvalidModel {
            field: "channels",
            ..
        }
    ));
    // C = 2^29, L = 1: 12 C^2 parameters are 12 * 2^58, and 4 bytes each overflow u64.
    let bytes_overflow = header_with(&[(4, 1), (5, 1), (6, 1 << 29)]);
    assert_eq!(
        format_error(LlmcCheckpoint::from_bytes(&bytes_overflow).unwrap_err()),
        LlmcFormatError::SizeOverflow
    );
    // 50 trillion parameters: representable, so it must be the length check that refuses,
    // on the stream path too (which would otherwise try to read 200 TB).
    let huge = header_with(&[(4, 1000), (5, 1), (6, 65_536)]);
    assert!(matches!(
        format_error(LlmcCheckpoint::from_bytes(&huge).unwrap_err()),
        LlmcFormatError::LengthMismatch { .. }
    ));
    assert!(matches!(
        format_error(LlmcCheckpoint::read_from(&huge[..]).unwrap_err()),
        LlmcFormatError::LengthMismatch { .. }
    ));
    let dir = temp_dir("huge");
    let path = dir.join("huge.bin");
    std::fs::write(&path, &huge).unwrap();
    assert!(matches!(
        format_error(LlmcCheckpoint::load(&path).unwrap_err()),
        LlmcFormatError::LengthMismatch { .. }
    ));
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn trailing_bytes_are_refused() {
    let mut bytes = counting(tiny()).to_bytes();
    bytes.push(0);
    assert!(matches!(
        format_error(LlmcCheckpoint::from_bytes(&bytes).unwrap_err()),
        LlmcFormatError::LengthMismatch { .. }
    ));
    assert!(matches!(
        format_error(LlmcCheckpoint::read_from(&bytes[..]).unwrap_err()),
        LlmcFormatError::LengthMismatch { .. }
    ));
}
