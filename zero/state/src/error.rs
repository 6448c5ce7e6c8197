//! The errors of saving and loading a training state, and the one I/O error they (and every
//! crate that uses [`fsio`](crate::fsio)) carry.

use std::path::PathBuf;

/// Result alias of this crate.
pub type Result<T, E = StateError> = std::result::Result<T, E>;

/// An I/O operation that failed on a file or folder: what was being done, to which path,
/// and what the OS said. Made by `fsio::failed`, so a failed open, read or write reads the
/// same everywhere and names the path.
#[derive(Debug, thiserror::Error)]
#[error("cannot {op} {path}: {source}")]
pub struct IoError {
    /// What was being done ("open", "read", "write", "create directory", ...).
    pub op: &'static str,
    /// The file or folder.
    pub path: PathBuf,
    /// What the OS said.
    #[source]
    pub source: std::io::Error,
}

/// Why a training state could not be saved, read or loaded.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// An I/O operation on a file or folder failed.
    #[error(transparent)]
    Io(#[from] IoError),
    /// A save that another rank failed (that rank reports its own error).
    #[error("training state {path}: another rank failed while saving (its error is reported by that rank)")]
    PeerFailed {
        /// The state directory.
        path: PathBuf,
    },
    /// A save whose disk is full: this rank's pieces and the free bytes it found.
    #[error(
        "cannot write {path}: its disk is full: this rank's pieces need {needed} bytes and the \
         disk had {} when the save began; free some space or give --save another folder",
        free.map_or("an unknown number of bytes free".to_string(), |f| format!("{f} bytes free"))
    )]
    DiskFull {
        /// The piece file (or folder) being written.
        path: PathBuf,
        /// Bytes of this rank's pieces.
        needed: u64,
        /// Free bytes on the folder's disk when the save began, where the OS tells.
        free: Option<u64>,
    },
    /// A training-state manifest that cannot be used.
    #[error("training state {path}: {reason}")]
    BadState {
        /// The state directory.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A tensor whose stored bytes do not match their checksum.
    #[error("training state {path}: tensor {name} is corrupt (checksum {found:016x}, manifest says {expected:016x})")]
    ChecksumMismatch {
        /// The piece file.
        path: PathBuf,
        /// The piece.
        name: String,
        /// Checksum in the manifest.
        expected: u64,
        /// Checksum of the bytes read.
        found: u64,
    },
    /// A tensor that is not in the state, or not with the type asked for.
    #[error("training state {path}: tensor {name}: {reason}")]
    Tensor {
        /// The state directory or piece file.
        path: PathBuf,
        /// The tensor.
        name: String,
        /// What is wrong (missing, wrong dtype or length, duplicate name).
        reason: String,
    },
    /// A state whose units or precision are not the engine's that loads it.
    #[error("cannot resume from {dir}: {reason}")]
    Mismatch {
        /// The state folder.
        dir: PathBuf,
        /// What does not match.
        reason: String,
    },
    /// The engine failed while its states were read out or loaded.
    #[error(transparent)]
    Engine(#[from] zero::Error),
    /// The collective by which the ranks agree on a save's outcome failed.
    #[error(transparent)]
    Comm(#[from] zero_comm::CommError),
    /// A manifest or a rank's piece index that is not valid JSON of the expected shape, or
    /// could not be encoded.
    #[error("{path}: JSON: {source}")]
    Json {
        /// The file.
        path: PathBuf,
        /// The parser's error.
        #[source]
        source: serde_json::Error,
    },
}
