//! Finding peers before a backend exists: the torchrun launch variables and a small TCP
//! rendezvous that moves an opaque id (NCCL's 128-byte unique id) from rank 0 to the others.
//!
//! Neither needs a GPU or MPI, so both build and are tested everywhere; the NCCL backend
//! (feature `cuda`) uses them in `NcclComm::from_env`.
//!
//! # Examples
//! ```
//! use std::time::Duration;
//! use zero_comm::bootstrap::{fetch, Server};
//!
//! let server = Server::bind("127.0.0.1:0")?; // port 0: any free port
//! let addr = server.local_addr()?.to_string();
//! let peer = std::thread::spawn(move || fetch(&addr, 1, Duration::from_secs(10)));
//! server.serve(b"opaque id", 2, Duration::from_secs(10))?;
//! assert_eq!(peer.join().unwrap()?, b"opaque id");
//! # Ok::<(), zero_comm::CommError>(())
//! ```

mod client;
mod env;
mod id;
mod rendezvous;
#[cfg(test)]
mod tests;

pub use client::fetch;
pub use env::LaunchEnv;
pub use id::broadcast_id;
pub use rendezvous::{Server, MAGIC, MAX_PAYLOAD, VERSION};
