//! The TCP backend's wire format: frame headers, error payloads, and socket reads and writes
//! that never outlive a deadline. All integers are little-endian.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::Instant;

use crate::dtype::DType;
use crate::op::{OpDesc, OpKind};
use crate::reduce_op::ReduceOp;

/// First bytes of every frame.
pub(crate) const FRAME_MAGIC: [u8; 4] = *b"ZTCF";
/// Bytes of a frame header.
pub(crate) const HEADER_BYTES: usize = 36;
/// Largest error payload a rank accepts (code, rank, and a message or a peer's header).
pub(crate) const MAX_ERROR_BYTES: usize = 1024;
/// "No root" / "no value" on the wire.
const NONE: u32 = u32::MAX;

const KINDS: [OpKind; 7] = OpKind::ALL;
const DTYPES: [DType; DType::ALL.len()] = DType::ALL;
const OPS: [ReduceOp; 4] = ReduceOp::ALL;

/// Whether a frame carries data or a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    Ok = 0,
    Error = 1,
}

/// A frame header: the collective it belongs to and the payload bytes that follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header {
    pub desc: OpDesc,
    pub status: Status,
    pub len: u64,
}

/// Index + 1 of `v` in `table`, 0 for `None`.
fn code<T: PartialEq>(table: &[T], v: Option<T>) -> u8 {
    v.and_then(|v| table.iter().position(|t| *t == v))
        .map_or(0, |i| (i + 1) as u8)
}

/// Back from [`code`]; `Err` for a code outside the table.
fn lookup<T: Copy>(table: &[T], c: u8) -> Result<Option<T>, ()> {
    match c {
        0 => Ok(None),
        c => table.get(usize::from(c) - 1).copied().map(Some).ok_or(()),
    }
}

impl Header {
    /// Layout: magic[4] seq:u64 kind:u8 status:u8 dtype:u8 redop:u8 root:u32 count:u64
    /// len:u64 (codes are 1 + the index in the order of the enums' declarations, 0 = none).
    pub(crate) fn encode(&self) -> [u8; HEADER_BYTES] {
        let d = &self.desc;
        let mut h = [0u8; HEADER_BYTES];
        h[..4].copy_from_slice(&FRAME_MAGIC);
        h[4..12].copy_from_slice(&d.seq.to_le_bytes());
        h[12] = code(&KINDS, Some(d.kind));
        h[13] = self.status as u8;
        h[14] = code(&DTYPES, d.dtype);
        h[15] = code(&OPS, d.op);
        let root = d.root.and_then(|r| u32::try_from(r).ok()).unwrap_or(NONE);
        h[16..20].copy_from_slice(&root.to_le_bytes());
        h[20..28].copy_from_slice(&(d.count as u64).to_le_bytes());
        h[28..36].copy_from_slice(&self.len.to_le_bytes());
        h
    }

    /// Parses a header, refusing anything a correct peer cannot have sent.
    pub(crate) fn decode(h: &[u8; HEADER_BYTES]) -> Result<Header, String> {
        if h[..4] != FRAME_MAGIC {
            return Err(format!(
                "bad magic {:02x?}, expected {FRAME_MAGIC:02x?}",
                &h[..4]
            ));
        }
        let u64_at = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&h[i..i + 8]);
            u64::from_le_bytes(b)
        };
        let kind = lookup(&KINDS, h[12])
            .ok()
            .flatten()
            .ok_or_else(|| format!("unknown op code {}", h[12]))?;
        let status = match h[13] {
            0 => Status::Ok,
            1 => Status::Error,
            s => return Err(format!("unknown status {s}")),
        };
        let dtype = lookup(&DTYPES, h[14]).map_err(|()| format!("unknown dtype {}", h[14]))?;
        let op = lookup(&OPS, h[15]).map_err(|()| format!("unknown redop {}", h[15]))?;
        let root = u32::from_le_bytes([h[16], h[17], h[18], h[19]]);
        let count = usize::try_from(u64_at(20)).map_err(|_| "count past usize".to_string())?;
        let desc = OpDesc {
            seq: u64_at(4),
            kind,
            dtype,
            count,
            root: (root != NONE).then_some(root as usize),
            op,
        };
        Ok(Header {
            desc,
            status,
            len: u64_at(28),
        })
    }
}

/// How a socket operation failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum IoFail {
    /// The deadline passed.
    TimedOut,
    /// The peer closed (or reset) the connection.
    Closed,
    /// Anything else, with the system's words.
    Other(String),
    /// The peer sent bytes a correct peer cannot send.
    Malformed(String),
}

fn classify(e: &std::io::Error) -> Option<IoFail> {
    match e.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted => None,
        ErrorKind::ConnectionReset
        | ErrorKind::ConnectionAborted
        | ErrorKind::BrokenPipe
        | ErrorKind::UnexpectedEof => Some(IoFail::Closed),
        _ => Some(IoFail::Other(e.to_string())),
    }
}

fn left(deadline: Instant) -> Result<std::time::Duration, IoFail> {
    deadline
        .checked_duration_since(Instant::now())
        .filter(|d| !d.is_zero())
        .ok_or(IoFail::TimedOut)
}

/// Fills `buf` from `s`, each read bounded by what is left until `deadline` (so a peer that
/// trickles bytes cannot stretch the wait).
pub(crate) fn read_full(
    s: &mut TcpStream,
    buf: &mut [u8],
    deadline: Instant,
) -> Result<(), IoFail> {
    let mut done = 0;
    while done < buf.len() {
        s.set_read_timeout(Some(left(deadline)?))
            .map_err(|e| IoFail::Other(e.to_string()))?;
        match s.read(&mut buf[done..]) {
            Ok(0) => return Err(IoFail::Closed),
            Ok(n) => done += n,
            Err(e) => {
                if let Some(fail) = classify(&e) {
                    return Err(fail);
                }
            }
        }
    }
    Ok(())
}

/// Writes all of `buf` to `s` before `deadline`.
pub(crate) fn write_full(s: &mut TcpStream, buf: &[u8], deadline: Instant) -> Result<(), IoFail> {
    let mut done = 0;
    while done < buf.len() {
        s.set_write_timeout(Some(left(deadline)?))
            .map_err(|e| IoFail::Other(e.to_string()))?;
        match s.write(&buf[done..]) {
            Ok(0) => return Err(IoFail::Closed),
            Ok(n) => done += n,
            Err(e) => {
                if let Some(fail) = classify(&e) {
                    return Err(fail);
                }
            }
        }
    }
    Ok(())
}

/// Reads and discards `len` bytes (a payload the receiver has no use for).
pub(crate) fn drain(s: &mut TcpStream, mut len: u64, deadline: Instant) -> Result<(), IoFail> {
    let mut sink = [0u8; 4096];
    while len > 0 {
        let n = usize::try_from(len).map_or(sink.len(), |l| l.min(sink.len()));
        read_full(s, &mut sink[..n], deadline)?;
        len -= n as u64;
    }
    Ok(())
}

/// Reads one header.
pub(crate) fn read_header(s: &mut TcpStream, deadline: Instant) -> Result<Header, IoFail> {
    let mut h = [0u8; HEADER_BYTES];
    read_full(s, &mut h, deadline)?;
    Header::decode(&h).map_err(IoFail::Malformed)
}

/// Writes one frame: header then payload.
pub(crate) fn write_frame(
    s: &mut TcpStream,
    desc: &OpDesc,
    status: Status,
    payload: &[u8],
    deadline: Instant,
) -> Result<(), IoFail> {
    let header = Header {
        desc: *desc,
        status,
        len: payload.len() as u64,
    };
    write_full(s, &header.encode(), deadline)?;
    write_full(s, payload, deadline)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip() {
        for kind in KINDS {
            for (dtype, op, root) in [
                (None, None, None),
                (Some(DType::F16), Some(ReduceOp::Min), Some(3)),
            ] {
                let desc = OpDesc {
                    seq: 7,
                    kind,
                    dtype,
                    count: 1 << 33,
                    root,
                    op,
                };
                let h = Header {
                    desc,
                    status: Status::Error,
                    len: 12,
                };
                assert_eq!(Header::decode(&h.encode()), Ok(h));
            }
        }
    }

    #[test]
    fn bad_codes_are_refused() {
        let desc = OpDesc {
            seq: 0,
            kind: OpKind::Barrier,
            dtype: None,
            count: 0,
            root: None,
            op: None,
        };
        let good = Header {
            desc,
            status: Status::Ok,
            len: 0,
        }
        .encode();
        for (at, value) in [(0, b'X'), (12, 0), (12, 8), (13, 2), (14, 7), (15, 5)] {
            let mut h = good;
            h[at] = value;
            assert!(Header::decode(&h).is_err(), "byte {at} = {value}");
        }
    }
}
