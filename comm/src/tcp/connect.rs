//! Forming a group: rank 0 accepts one connection per other rank, each opened with a hello
//! (`b"ZTCH"`, version: u16, rank: u32, size: u32); once every rank is in, rank 0 answers
//! each with a welcome (`b"ZTCW"`, version: u16, size: u32).
//!
//! A connection whose hello does not start with the magic (a port scanner, a stray client)
//! is dropped and not counted; a real rank that names a wrong size, a rank out of range or a
//! rank already present fails the group, since that is a launch mistake.

use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::error::{CommError, Result};

use super::wire::{self, IoFail};
use super::TcpComm;

const HELLO_MAGIC: [u8; 4] = *b"ZTCH";
const WELCOME_MAGIC: [u8; 4] = *b"ZTCW";
/// Protocol version; a peer speaking another is refused.
pub(crate) const VERSION: u16 = 1;
/// How long rank 0 gives one connection to say hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause between connection attempts while rank 0 is not listening yet.
const RETRY_PAUSE: Duration = Duration::from_millis(20);

pub(crate) fn err(addr: impl ToString, what: impl Into<String>) -> CommError {
    CommError::Rendezvous {
        addr: addr.to_string(),
        what: what.into(),
    }
}

fn io_text(fail: &IoFail) -> String {
    match fail {
        IoFail::TimedOut => "timed out".into(),
        IoFail::Closed => "connection closed".into(),
        IoFail::Other(e) | IoFail::Malformed(e) => e.clone(),
    }
}

fn check_size(size: usize) -> Result<u32> {
    u32::try_from(size)
        .ok()
        .filter(|&s| s > 0 && s < u32::MAX)
        .ok_or_else(|| CommError::InvalidArgument {
            what: format!("a TCP group of {size} ranks (1..{} allowed)", u32::MAX),
        })
}

/// Rank 0's side of forming a group: a bound socket.
#[derive(Debug)]
pub struct Listener {
    listener: TcpListener,
}

impl Listener {
    /// Binds `addr` (`host:port`; port 0 picks a free one, see [`Listener::local_addr`]).
    ///
    /// # Errors
    /// [`CommError::Rendezvous`] when the address does not resolve or cannot be bound.
    pub fn bind(addr: &str) -> Result<Listener> {
        let listener =
            TcpListener::bind(addr).map_err(|e| err(addr, format!("cannot bind: {e}")))?;
        Ok(Listener { listener })
    }

    /// The bound address (with the port the system picked).
    ///
    /// # Errors
    /// [`CommError::Rendezvous`] when the socket cannot say.
    pub fn local_addr(&self) -> Result<SocketAddr> {
        self.listener
            .local_addr()
            .map_err(|e| err("listener", e.to_string()))
    }

    /// Waits until ranks `1..size` have joined (see [`join`](super::join)) and returns rank
    /// 0's communicator of the group.
    ///
    /// # Errors
    /// [`CommError::Rendezvous`] when ranks are missing at `config.timeout` (named) or a
    /// rank's hello contradicts the group; [`CommError::InvalidArgument`] for a size of 0.
    pub fn accept_group(self, size: usize, config: Config) -> Result<crate::Communicator> {
        let comm = self.accept_backend(size, config)?;
        Ok(crate::Communicator::new(Box::new(comm), config))
    }

    pub(crate) fn accept_backend(self, size: usize, config: Config) -> Result<TcpComm> {
        let wire_size = check_size(size)?;
        let addr = self.local_addr()?;
        let fail = |what: String| err(addr, what);
        self.listener
            .set_nonblocking(true)
            .map_err(|e| fail(e.to_string()))?;
        let deadline = Instant::now() + config.timeout;
        let mut joined: BTreeMap<usize, TcpStream> = BTreeMap::new();
        let mut strays = 0usize;
        while joined.len() + 1 < size {
            match self.listener.accept() {
                Ok((stream, peer)) => match read_hello(stream, deadline) {
                    Ok(Some((rank, their_size, stream))) => {
                        if their_size != size || rank == 0 || rank >= size {
                            return Err(fail(format!("{peer} joined as rank {rank} of {their_size}, but the group has {size} ranks")));
                        }
                        if joined.insert(rank, stream).is_some() {
                            return Err(fail(format!(
                                "rank {rank} joined twice (last from {peer})"
                            )));
                        }
                    }
                    Ok(None) => strays += 1,
                    Err(why) => {
                        tracing::warn!("tcp group at {addr}: dropped {peer}: {why}");
                        strays += 1;
                    }
                },
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        let missing: Vec<usize> =
                            (1..size).filter(|r| !joined.contains_key(r)).collect();
                        return Err(fail(format!(
                            "timed out after {:?}: ranks {missing:?} did not join ({strays} stray connections dropped)",
                            config.timeout
                        )));
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(e) => return Err(fail(format!("accept failed: {e}"))),
            }
        }
        let mut welcome = WELCOME_MAGIC.to_vec();
        welcome.extend_from_slice(&VERSION.to_le_bytes());
        welcome.extend_from_slice(&wire_size.to_le_bytes());
        let mut links: Vec<TcpStream> = joined.into_values().collect();
        for (i, link) in links.iter_mut().enumerate() {
            wire::write_full(link, &welcome, deadline)
                .map_err(|f| fail(format!("welcoming rank {}: {}", i + 1, io_text(&f))))?;
        }
        TcpComm::new(0, size, config, links)
    }
}

/// Reads a hello: `Ok(None)` for a connection that is not one of ours.
fn read_hello(
    mut stream: TcpStream,
    deadline: Instant,
) -> std::result::Result<Option<(usize, usize, TcpStream)>, String> {
    stream.set_nonblocking(false).map_err(|e| e.to_string())?;
    let mut hello = [0u8; 14];
    let limit = deadline.min(Instant::now() + HELLO_TIMEOUT);
    wire::read_full(&mut stream, &mut hello, limit).map_err(|f| io_text(&f))?;
    if hello[..4] != HELLO_MAGIC {
        return Ok(None);
    }
    let version = u16::from_le_bytes([hello[4], hello[5]]);
    if version != VERSION {
        return Err(format!("protocol version {version}, expected {VERSION}"));
    }
    let rank = u32::from_le_bytes([hello[6], hello[7], hello[8], hello[9]]) as usize;
    let size = u32::from_le_bytes([hello[10], hello[11], hello[12], hello[13]]) as usize;
    Ok(Some((rank, size, stream)))
}

/// Joins the group that rank 0 forms at `addr` (`host:port`) as `rank` of `size`, retrying
/// refused connections until `config.timeout` (rank 0 may start later); returns once every
/// rank has joined.
///
/// # Errors
/// [`CommError::Rendezvous`] when `addr` does not resolve, nobody accepts it in time, or
/// what answers is not a rank 0 of this protocol and size; [`CommError::InvalidArgument`] for
/// rank 0 (which uses [`Listener`]) or a rank outside `1..size`.
pub fn join(addr: &str, rank: usize, size: usize, config: Config) -> Result<crate::Communicator> {
    let comm = join_backend(addr, rank, size, config)?;
    Ok(crate::Communicator::new(Box::new(comm), config))
}

pub(crate) fn join_backend(
    addr: &str,
    rank: usize,
    size: usize,
    config: Config,
) -> Result<TcpComm> {
    let wire_size = check_size(size)?;
    if rank == 0 || rank >= size {
        return Err(CommError::InvalidArgument {
            what: format!(
                "tcp::join as rank {rank} of {size}: rank 0 uses Listener, others are 1..{size}"
            ),
        });
    }
    let deadline = Instant::now() + config.timeout;
    let mut stream = connect(addr, deadline)?;
    let mut hello = HELLO_MAGIC.to_vec();
    hello.extend_from_slice(&VERSION.to_le_bytes());
    hello.extend_from_slice(&(rank as u32).to_le_bytes());
    hello.extend_from_slice(&wire_size.to_le_bytes());
    let fail = |what: String| err(addr, what);
    wire::write_full(&mut stream, &hello, deadline)
        .map_err(|f| fail(format!("hello: {}", io_text(&f))))?;
    let mut welcome = [0u8; 10];
    wire::read_full(&mut stream, &mut welcome, deadline)
        .map_err(|f| fail(format!("waiting for the group to form: {}", io_text(&f))))?;
    let version = u16::from_le_bytes([welcome[4], welcome[5]]);
    let their_size = u32::from_le_bytes([welcome[6], welcome[7], welcome[8], welcome[9]]);
    if welcome[..4] != WELCOME_MAGIC || version != VERSION || their_size != wire_size {
        return Err(fail(format!(
            "malformed welcome {welcome:02x?} (is another service on this port?)"
        )));
    }
    TcpComm::new(rank, size, config, vec![stream])
}

/// Connects to `addr`, retrying until `deadline` while nobody listens there yet.
fn connect(addr: &str, deadline: Instant) -> Result<TcpStream> {
    let targets: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|e| err(addr, format!("does not resolve: {e}")))?
        .collect();
    let mut last = String::from("no address to try");
    loop {
        for target in &targets {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(err(
                    addr,
                    format!("nobody accepted before the timeout; last error: {last}"),
                ));
            }
            match TcpStream::connect_timeout(target, left) {
                Ok(s) => return Ok(s),
                Err(e) => last = format!("connecting to {target}: {e}"),
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(err(
                addr,
                format!("nobody accepted before the timeout; last error: {last}"),
            ));
        }
        std::thread::sleep(RETRY_PAUSE.min(left));
    }
}
