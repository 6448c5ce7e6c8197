//! One I/O error type across the crate: a missing file reads the same from the data
//! pipeline, the checkpoint reader, the config loader and the top-level error, and names
//! the file. The reference message is built here from what the OS says for the same open.

use std::path::{Path, PathBuf};

use zero_train::checkpoint::LlmcCheckpoint;
use zero_train::data::TokenFile;
use zero_train::error::IoError;
use zero_train::{TrainArgs, TrainError};

fn missing(name: &str) -> PathBuf {
    std::env::temp_dir()
        .join(format!("zero-io-errors-{}", std::process::id()))
        .join(name)
}

/// "cannot <op> <path>: <what the OS says>", from the OS directly.
fn expected(op: &str, path: &Path) -> String {
    let os = std::fs::File::open(path).unwrap_err();
    format!("cannot {op} {}: {os}", path.display())
}

#[test]
fn a_missing_file_reads_the_same_from_data_checkpoint_and_config() {
    let tokens = missing("train.bin");
    let data = TokenFile::open(&tokens).unwrap_err();
    assert_eq!(data.to_string(), expected("open", &tokens));
    assert_eq!(
        TrainError::from(data).to_string(),
        expected("open", &tokens)
    );

    let model = missing("model.bin");
    let ckpt = LlmcCheckpoint::load(&model).unwrap_err();
    assert_eq!(ckpt.to_string(), expected("open", &model));
    assert_eq!(TrainError::from(ckpt).to_string(), expected("open", &model));

    let config = missing("run.toml");
    let err = TrainArgs::from_toml_file(&config).unwrap_err();
    assert_eq!(err.to_string(), expected("read config file", &config));
}

#[test]
fn the_io_error_keeps_the_os_error_as_its_source() {
    let path = missing("x.bin");
    let err = IoError {
        op: "read",
        path: path.clone(),
        source: std::io::ErrorKind::NotFound.into(),
    };
    let source = std::error::Error::source(&err).map(ToString::to_string);
    assert_eq!(
        source,
        Some(std::io::Error::from(std::io::ErrorKind::NotFound).to_string())
    );
    assert!(err.to_string().contains(&path.display().to_string()));
}
