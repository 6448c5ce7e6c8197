//! A TCP rendezvous: rank 0 serves an opaque payload to every other rank.
//!
//! Protocol (all integers little-endian):
//! 1. rank 0 binds `MASTER_ADDR:MASTER_PORT` and accepts connections until every rank in
//!    `1..world_size` has been served or the timeout passes;
//! 2. rank r connects (retrying refused connections until its deadline: rank 0 may start
//!    later) and sends a hello: `MAGIC`, `VERSION: u16`, `r: u32`;
//! 3. rank 0 checks the hello (a stray client is dropped and not counted) and replies
//!    `MAGIC`, `VERSION: u16`, `len: u32`, then `len` payload bytes;
//! 4. rank r checks magic, version and `len <= MAX_PAYLOAD` before reading the payload, so a
//!    reply from something else on that port is a clear error, not garbage.
//!
//! Every socket operation runs under the caller's deadline: nothing here can hang.

use std::collections::BTreeSet;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use crate::error::{CommError, Result};

/// First bytes of every message.
pub const MAGIC: [u8; 4] = *b"ZRDV";
/// Protocol version; a peer speaking another is refused.
pub const VERSION: u16 = 1;
/// Largest payload accepted (NCCL's id is 128 bytes).
pub const MAX_PAYLOAD: usize = 64 << 10;
/// How long rank 0 gives one connected client to say hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

pub(super) fn err(addr: impl ToString, what: impl Into<String>) -> CommError {
    CommError::Rendezvous {
        addr: addr.to_string(),
        what: what.into(),
    }
}

pub(super) fn remaining(deadline: Instant) -> Option<Duration> {
    deadline
        .checked_duration_since(Instant::now())
        .filter(|d| !d.is_zero())
}

pub(super) fn check_header(header: &[u8], addr: &str) -> Result<()> {
    if header[..4] != MAGIC {
        return Err(err(addr, format!(
            "malformed reply: magic {:02x?}, expected {MAGIC:02x?} (is another service on this port?)",
            &header[..4]
        )));
    }
    let version = u16::from_le_bytes([header[4], header[5]]);
    if version != VERSION {
        return Err(err(
            addr,
            format!("protocol version {version}, expected {VERSION}"),
        ));
    }
    Ok(())
}

/// Rank 0's side: a bound listener.
#[derive(Debug)]
pub struct Server {
    listener: TcpListener,
}

impl Server {
    /// Binds `addr` (`host:port`; port 0 picks a free one, see [`Server::local_addr`]).
    ///
    /// # Errors
    /// [`CommError::Rendezvous`] when the address does not resolve or cannot be bound.
    pub fn bind(addr: &str) -> Result<Server> {
        let listener =
            TcpListener::bind(addr).map_err(|e| err(addr, format!("cannot bind: {e}")))?;
        Ok(Server { listener })
    }

    /// The bound address.
    ///
    /// # Errors
    /// [`CommError::Rendezvous`] when the socket cannot say.
    pub fn local_addr(&self) -> Result<SocketAddr> {
        self.listener
            .local_addr()
            .map_err(|e| err("listener", e.to_string()))
    }

    /// Serves `payload` to ranks `1..world_size`, each once, and returns when all have it.
    ///
    /// # Errors
    /// [`CommError::Rendezvous`] naming the ranks that had not connected when `timeout`
    /// passed, or a socket failure; [`CommError::InvalidArgument`] for a payload past
    /// [`MAX_PAYLOAD`].
    pub fn serve(&self, payload: &[u8], world_size: usize, timeout: Duration) -> Result<()> {
        let addr = self.local_addr()?;
        let len = u32::try_from(payload.len())
            .ok()
            .filter(|_| payload.len() <= MAX_PAYLOAD)
            .ok_or_else(|| CommError::InvalidArgument {
                what: format!(
                    "rendezvous payload of {} bytes (max {MAX_PAYLOAD})",
                    payload.len()
                ),
            })?;
        let mut reply = Vec::with_capacity(10 + payload.len());
        reply.extend_from_slice(&MAGIC);
        reply.extend_from_slice(&VERSION.to_le_bytes());
        reply.extend_from_slice(&len.to_le_bytes());
        reply.extend_from_slice(payload);

        self.listener
            .set_nonblocking(true)
            .map_err(|e| err(addr, e.to_string()))?;
        let deadline = Instant::now() + timeout;
        let mut served = BTreeSet::new();
        while served.len() + 1 < world_size {
            match self.listener.accept() {
                Ok((stream, peer)) => match answer(stream, &reply, world_size, deadline) {
                    Ok(rank) => {
                        served.insert(rank);
                    }
                    Err(why) => tracing::warn!("rendezvous at {addr}: dropped {peer}: {why}"),
                },
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    if remaining(deadline).is_none() {
                        let missing: Vec<usize> =
                            (1..world_size).filter(|r| !served.contains(r)).collect();
                        return Err(err(
                            addr,
                            format!(
                                "timed out after {timeout:?}: ranks {missing:?} did not connect"
                            ),
                        ));
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(e) => return Err(err(addr, format!("accept failed: {e}"))),
            }
        }
        Ok(())
    }
}

/// Reads one hello and sends the reply; returns the client's rank.
fn answer(
    mut stream: TcpStream,
    reply: &[u8],
    world_size: usize,
    deadline: Instant,
) -> std::io::Result<usize> {
    let limit = remaining(deadline)
        .unwrap_or(Duration::from_millis(1))
        .min(HELLO_TIMEOUT);
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(limit))?;
    stream.set_write_timeout(Some(limit))?;
    let mut hello = [0u8; 10];
    stream.read_exact(&mut hello)?;
    let rank = u32::from_le_bytes([hello[6], hello[7], hello[8], hello[9]]) as usize;
    let version = u16::from_le_bytes([hello[4], hello[5]]);
    if hello[..4] != MAGIC || version != VERSION || rank == 0 || rank >= world_size {
        let what = format!("bad hello {hello:02x?} (world size {world_size})");
        return Err(std::io::Error::new(ErrorKind::InvalidData, what));
    }
    stream.write_all(reply)?;
    stream.flush()?;
    Ok(rank)
}
