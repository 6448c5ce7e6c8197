//! Token files: round trips, and each kind of damage gives its own error naming the file.

use std::path::PathBuf;

use proptest::prelude::*;
use zero_train::data::{
    DataError, TokenFile, TokenFileError, GPT2_VOCAB, HEADER_BYTES, TOKEN_MAGIC,
};
use zero_train::error::IoError;

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("zero-data-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn format_error(err: DataError) -> TokenFileError {
    match err {
        DataError::Format { source, .. } => source,
        other => panic!("expected a format error, got {other:?}"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn bytes_round_trip(tokens in prop::collection::vec(0u16..50_257, 0..500)) {
        let file = TokenFile::from_tokens(tokens.clone()).unwrap();
        let bytes = file.to_bytes();
        prop_assert_eq!(TokenFile::from_bytes(&bytes, GPT2_VOCAB).unwrap().tokens().to_vec(), tokens.clone());
        prop_assert_eq!(TokenFile::read_from(&bytes[..], GPT2_VOCAB).unwrap().tokens().to_vec(), tokens);
    }

    #[test]
    fn any_truncation_is_an_error(tokens in prop::collection::vec(0u16..50_257, 1..200), cut in 1usize..400) {
        let bytes = TokenFile::from_tokens(tokens).unwrap().to_bytes();
        let keep = bytes.len().saturating_sub(cut);
        prop_assert!(TokenFile::from_bytes(&bytes[..keep], GPT2_VOCAB).is_err());
        prop_assert!(TokenFile::read_from(&bytes[..keep], GPT2_VOCAB).is_err());
    }
}

#[test]
fn file_round_trip_through_disk() {
    let dir = temp_dir("roundtrip");
    let path = dir.join("t.bin");
    let file = TokenFile::from_tokens(vec![0, 1, 50_256, 42]).unwrap();
    file.write(&path).unwrap();
    assert_eq!(TokenFile::open(&path).unwrap(), file);
    assert!(
        !dir.join("t.bin.tmp").exists(),
        "the temporary file is renamed away"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn missing_file_is_an_io_error_naming_it() {
    let err = TokenFile::open("/nonexistent/zero/train.bin").unwrap_err();
    assert!(
        matches!(err, DataError::Io(IoError { op: "open", .. })),
        "{err:?}"
    );
    assert!(err.to_string().contains("/nonexistent/zero/train.bin"));
}

#[test]
fn truncated_header_is_reported_with_the_file_name() {
    let dir = temp_dir("trunc");
    let path = dir.join("short.bin");
    std::fs::write(&path, [0u8; 100]).unwrap();
    let err = TokenFile::open(&path).unwrap_err();
    assert!(err.to_string().contains("short.bin"), "{err}");
    assert_eq!(
        format_error(err),
        TokenFileError::TruncatedHeader {
            expected: HEADER_BYTES,
            got: 100
        }
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn truncated_payload_is_a_count_mismatch() {
    let dir = temp_dir("payload");
    let path = dir.join("cut.bin");
    let bytes = TokenFile::from_tokens(vec![5; 10]).unwrap().to_bytes();
    std::fs::write(&path, &bytes[..bytes.len() - 3]).unwrap();
    let err = format_error(TokenFile::open(&path).unwrap_err());
    assert_eq!(
        err,
        TokenFileError::CountMismatch {
            header_tokens: 10,
            expected_bytes: 20,
            payload_bytes: 17
        }
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn trailing_bytes_are_a_count_mismatch() {
    let mut bytes = TokenFile::from_tokens(vec![5; 4]).unwrap().to_bytes();
    bytes.extend_from_slice(&[1, 0]);
    let err = format_error(TokenFile::from_bytes(&bytes, GPT2_VOCAB).unwrap_err());
    assert!(
        matches!(
            err,
            TokenFileError::CountMismatch {
                payload_bytes: 10,
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn foreign_file_is_a_bad_magic() {
    let mut bytes = TokenFile::from_tokens(vec![1, 2]).unwrap().to_bytes();
    bytes[0] ^= 0xff;
    let err = format_error(TokenFile::from_bytes(&bytes, GPT2_VOCAB).unwrap_err());
    assert!(
        matches!(
            err,
            TokenFileError::BadMagic {
                expected: TOKEN_MAGIC,
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn version_two_is_refused() {
    let mut bytes = TokenFile::from_tokens(vec![1, 2]).unwrap().to_bytes();
    bytes[4..8].copy_from_slice(&2i32.to_le_bytes());
    let err = format_error(TokenFile::from_bytes(&bytes, GPT2_VOCAB).unwrap_err());
    assert_eq!(
        err,
        TokenFileError::BadVersion {
            supported: 1,
            found: 2
        }
    );
}

#[test]
fn negative_count_is_refused() {
    let mut bytes = TokenFile::from_tokens(vec![]).unwrap().to_bytes();
    bytes[8..12].copy_from_slice(&(-1i32).to_le_bytes());
    let err = format_error(TokenFile::from_bytes(&bytes, GPT2_VOCAB).unwrap_err());
    assert_eq!(err, TokenFileError::NegativeCount { count: -1 });
}

#[test]
fn huge_count_in_a_stream_does_not_allocate_the_claim() {
    // The header claims 2^31-1 tokens; the stream holds 4. The reader must stop at EOF.
    let mut bytes = TokenFile::from_tokens(vec![1; 4]).unwrap().to_bytes();
    bytes[8..12].copy_from_slice(&i32::MAX.to_le_bytes());
    let err = format_error(TokenFile::read_from(&bytes[..], GPT2_VOCAB).unwrap_err());
    assert!(
        matches!(
            err,
            TokenFileError::CountMismatch {
                payload_bytes: 8,
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn token_outside_vocab_is_refused_with_its_index() {
    let mut bytes = TokenFile::from_tokens(vec![1, 2, 3]).unwrap().to_bytes();
    bytes[HEADER_BYTES + 2..HEADER_BYTES + 4].copy_from_slice(&60_000u16.to_le_bytes());
    let err = format_error(TokenFile::from_bytes(&bytes, GPT2_VOCAB).unwrap_err());
    assert_eq!(
        err,
        TokenFileError::TokenOutOfRange {
            index: 1,
            token: 60_000,
            vocab: GPT2_VOCAB
        }
    );
    assert!(TokenFile::from_tokens(vec![50_257]).is_err());
    // A smaller vocabulary is enforced too.
    assert!(
        TokenFile::from_bytes(&TokenFile::from_tokens(vec![9]).unwrap().to_bytes(), 9).is_err()
    );
}
