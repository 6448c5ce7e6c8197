//! What the user types: the flags and the `--config` file ([`args`]), the one configuration
//! they form ([`config`]) and the range of every value in it ([`validate`]).

pub mod args;
pub mod config;
pub mod validate;
mod validate_offload;
