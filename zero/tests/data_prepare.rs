//! prepare: text files to train.bin / val.bin with GPT-2 BPE.

use std::path::PathBuf;

use zero::data::{prepare, Error, TokenFile, GPT2_EOT};

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
        Err(Error::InvalidPrepare { .. })
    ));
    let text = dir.join("t.txt");
    std::fs::write(&text, "some text here").unwrap();
    assert!(matches!(
        prepare(std::slice::from_ref(&text), &out, 0.0),
        Err(Error::InvalidPrepare { .. })
    ));
    assert!(matches!(
        prepare(&[text], &out, 1.0),
        Err(Error::InvalidPrepare { .. })
    ));
    let missing = dir.join("missing.txt");
    assert!(matches!(
        prepare(&[missing], &out, 0.1),
        Err(Error::Io { .. })
    ));
    let latin1 = dir.join("latin1.txt");
    std::fs::write(&latin1, [b'a', 0xe9, b'b']).unwrap();
    assert!(matches!(
        prepare(&[latin1], &out, 0.1),
        Err(Error::NotUtf8 { valid_up_to: 1, .. })
    ));
    std::fs::remove_dir_all(dir).unwrap();
}
