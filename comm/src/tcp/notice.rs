//! The payload of an error frame: why rank 0 ended a collective, sent to every rank it can
//! still reach so that all of them fail with the same cause.
//!
//! Layout: `code: u8`, `rank: u32`, then by code: 1 mismatch (the peer's encoded header),
//! 2 left, 3 timed out (`seq: u64`), 4 failed (UTF-8 text), 5 panicked, 6 mismatch cause
//! (`seq: u64`).

use crate::error::BreakCause;
use crate::op::OpDesc;

use super::wire::{Header, Status, HEADER_BYTES, MAX_ERROR_BYTES};

/// What rank 0 tells the others when a collective cannot complete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Notice {
    /// The receiver's call differs from `peer`'s, which issued `desc`.
    Mismatch { peer: usize, desc: OpDesc },
    /// The group is broken.
    Cause(BreakCause),
}

/// Room left for a failure's text.
const MAX_TEXT: usize = MAX_ERROR_BYTES - 5;

fn rank_u32(rank: usize) -> [u8; 4] {
    u32::try_from(rank).unwrap_or(u32::MAX).to_le_bytes()
}

fn truncated(text: &str) -> &str {
    let mut end = text.len().min(MAX_TEXT);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

impl Notice {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let (code, rank, rest): (u8, usize, Vec<u8>) = match self {
            Notice::Mismatch { peer, desc } => {
                let h = Header {
                    desc: *desc,
                    status: Status::Ok,
                    len: 0,
                };
                (1, *peer, h.encode().to_vec())
            }
            Notice::Cause(c) => match c {
                BreakCause::Left { rank } => (2, *rank, Vec::new()),
                BreakCause::TimedOut { rank, seq } => (3, *rank, seq.to_le_bytes().to_vec()),
                BreakCause::Failed { rank, what } => {
                    (4, *rank, truncated(what).as_bytes().to_vec())
                }
                BreakCause::Panicked { rank } => (5, *rank, Vec::new()),
                BreakCause::Mismatch { seq } => (6, 0, seq.to_le_bytes().to_vec()),
            },
        };
        let mut out = Vec::with_capacity(5 + rest.len());
        out.push(code);
        out.extend_from_slice(&rank_u32(rank));
        out.extend_from_slice(&rest);
        out
    }

    pub(crate) fn decode(b: &[u8]) -> Result<Notice, String> {
        let (&code, rest) = b.split_first().ok_or("empty error payload")?;
        let (rank, rest) = rest
            .split_first_chunk::<4>()
            .ok_or("error payload without a rank")?;
        let rank = u32::from_le_bytes(*rank) as usize;
        let seq = || {
            rest.first_chunk::<8>()
                .map(|s| u64::from_le_bytes(*s))
                .ok_or_else(|| "error payload without a sequence number".to_string())
        };
        Ok(match code {
            1 => {
                let h: &[u8; HEADER_BYTES] = rest
                    .first_chunk()
                    .ok_or("mismatch notice without the peer's header")?;
                let desc = Header::decode(h)?.desc;
                Notice::Mismatch { peer: rank, desc }
            }
            2 => Notice::Cause(BreakCause::Left { rank }),
            3 => Notice::Cause(BreakCause::TimedOut { rank, seq: seq()? }),
            4 => Notice::Cause(BreakCause::Failed {
                rank,
                what: String::from_utf8_lossy(rest).into_owned(),
            }),
            5 => Notice::Cause(BreakCause::Panicked { rank }),
            6 => Notice::Cause(BreakCause::Mismatch { seq: seq()? }),
            c => return Err(format!("unknown error code {c}")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::OpKind;

    #[test]
    fn notices_round_trip() {
        let desc = OpDesc {
            seq: 3,
            kind: OpKind::AllGather,
            dtype: Some(crate::DType::Bf16),
            count: 12,
            root: None,
            op: None,
        };
        for n in [
            Notice::Mismatch { peer: 2, desc },
            Notice::Cause(BreakCause::Left { rank: 1 }),
            Notice::Cause(BreakCause::TimedOut { rank: 0, seq: 9 }),
            Notice::Cause(BreakCause::Failed {
                rank: 3,
                what: "bad frame".into(),
            }),
            Notice::Cause(BreakCause::Panicked { rank: 4 }),
            Notice::Cause(BreakCause::Mismatch { seq: 5 }),
        ] {
            let bytes = n.encode();
            assert!(bytes.len() <= MAX_ERROR_BYTES);
            assert_eq!(Notice::decode(&bytes), Ok(n));
        }
        assert!(Notice::decode(&[9, 0, 0, 0, 0]).is_err());
        assert!(Notice::decode(&[1, 0]).is_err());
    }
}
