//! The client side of the rendezvous (steps 2 and 4 of the protocol in `rendezvous.rs`).

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use super::rendezvous::{check_header, err, remaining, MAGIC, MAX_PAYLOAD, VERSION};
use crate::error::{CommError, Result};

/// What one connection attempt came to.
enum Attempt {
    /// Try again (refused, reset, closed early) while the deadline allows; `None` when the
    /// deadline passed before anything was tried (the previous reason stands).
    Retry(Option<String>),
    /// Stop: the peer answered something that is not this protocol, or time ran out.
    Fatal(CommError),
}

/// Rank `rank`'s side: connects to `addr` (`host:port`) and returns rank 0's payload,
/// retrying until `timeout` passes.
///
/// # Errors
/// [`CommError::Rendezvous`] on a malformed reply (wrong magic, version or length), or when
/// no reply came within `timeout` (the last connection error is named).
pub fn fetch(addr: &str, rank: usize, timeout: Duration) -> Result<Vec<u8>> {
    let rank32 = u32::try_from(rank).map_err(|_| CommError::InvalidArgument {
        what: format!("rank {rank} does not fit the rendezvous hello"),
    })?;
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(10);
    let mut last = String::from("no connection attempt finished");
    loop {
        match attempt(addr, rank32, deadline) {
            Ok(payload) => return Ok(payload),
            Err(Attempt::Fatal(e)) => return Err(e),
            Err(Attempt::Retry(why)) => last = why.unwrap_or(last),
        }
        let Some(left) = remaining(deadline) else {
            return Err(err(addr, format!("no reply within {timeout:?}: {last}")));
        };
        std::thread::sleep(pause.min(left));
        pause = (pause * 2).min(Duration::from_millis(500));
    }
}

fn attempt(addr: &str, rank: u32, deadline: Instant) -> Result<Vec<u8>, Attempt> {
    let targets: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|e| Attempt::Retry(Some(format!("cannot resolve: {e}"))))?
        .collect();
    let mut last = None;
    for target in targets {
        let Some(left) = remaining(deadline) else {
            break;
        };
        match TcpStream::connect_timeout(&target, left) {
            Ok(stream) => return exchange(stream, addr, rank, deadline),
            Err(e) => last = Some(format!("connecting to {target}: {e}")),
        }
    }
    Err(Attempt::Retry(last))
}

fn exchange(
    mut s: TcpStream,
    addr: &str,
    rank: u32,
    deadline: Instant,
) -> Result<Vec<u8>, Attempt> {
    let io = |e: std::io::Error| match e.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut => Attempt::Fatal(err(
            addr,
            format!("timed out waiting for rank 0's reply: {e}"),
        )),
        _ => Attempt::Retry(Some(format!("connection to {addr} failed: {e}"))),
    };
    let left = remaining(deadline).ok_or(Attempt::Retry(None))?;
    s.set_read_timeout(Some(left)).map_err(io)?;
    s.set_write_timeout(Some(left)).map_err(io)?;
    let mut hello = Vec::with_capacity(10);
    hello.extend_from_slice(&MAGIC);
    hello.extend_from_slice(&VERSION.to_le_bytes());
    hello.extend_from_slice(&rank.to_le_bytes());
    s.write_all(&hello).map_err(io)?;
    let mut header = [0u8; 10];
    s.read_exact(&mut header).map_err(io)?;
    check_header(&header, addr).map_err(Attempt::Fatal)?;
    let len = u32::from_le_bytes([header[6], header[7], header[8], header[9]]) as usize;
    if len > MAX_PAYLOAD {
        return Err(Attempt::Fatal(err(
            addr,
            format!("malformed reply: payload length {len} exceeds {MAX_PAYLOAD}"),
        )));
    }
    let mut payload = vec![0u8; len];
    s.read_exact(&mut payload).map_err(|e| match e.kind() {
        ErrorKind::UnexpectedEof => Attempt::Fatal(err(
            addr,
            format!(
                "malformed reply: announced {len} payload bytes, connection closed before them"
            ),
        )),
        _ => io(e),
    })?;
    Ok(payload)
}
