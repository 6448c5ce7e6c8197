//! The ZeRO engine's elastic training state: one piece file per rank plus a manifest,
//! written by every rank from the states it owns and readable at any world size and stage.
//!
//! - [`save_sharded`] ([`start_save`] and [`finish_save`] for a save written in the
//!   background) and [`load_sharded`]: an [`Engine`](zero::Engine)'s parameters and Adam
//!   moments out to a save directory and back, with the caller's metadata (any JSON) in the
//!   manifest, at any world size and stage.
//! - [`PieceWriter`], [`begin_save`] and [`publish`]: writing a state, crash-safe (the
//!   format and the publication protocol are in `sharded.rs`).
//! - [`ShardedReader`] and [`parse_manifest`]: reading any element range of any unit's
//!   states, each piece verified against its checksum.
//! - [`fsio`]: durable atomic replacement of a file and the [`IoError`] that names the
//!   failing operation and path, shared with the formats of the crates that use this one.
#![warn(missing_docs)]

mod checksum;
mod error;
pub mod fsio;
mod load;
mod save;
mod sharded;
mod sharded_read;
mod sharded_write;

pub use error::{IoError, Result, StateError};
pub use load::{load_sharded, load_sharded_with, verify_state, Source};
pub use save::{finish_save, save_sharded, start_save, PendingSave};
pub use sharded::{
    complete_states, partial_dir, piece_file_name, resolve_state_dir, step_dir, Partitioning,
    Piece, PieceFile, ShardedManifest, UnitPartition, LATEST, MANIFEST, OLDEST_SHARDED_VERSION,
    SHARDED_FORMAT, SHARDED_VERSION, TENSORS,
};
pub use sharded_read::{parse_manifest, ShardedReader};
pub use sharded_write::{begin_save, publish, PieceWriter};
