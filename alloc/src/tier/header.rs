//! The first [`HEADER_BYTES`] of a tier file: what the file holds and for whom, so that a
//! file of another run, rank, tier or layout is refused before a byte of it is read as
//! states.
//!
//! Layout (little-endian): magic `ZEROTIER` (8), version u32, rank u32, world u32, pad u32,
//! tier name (16, NUL-padded), run u64, pieces u64, layout u64 (FNV-1a of the piece lengths),
//! payload bytes u64, checksum u64 (FNV-1a of everything before it); zeros to 4096.

use std::fmt;

/// Bytes of the header; the pieces start after it, aligned.
pub const HEADER_BYTES: usize = 4096;
const MAGIC: &[u8; 8] = b"ZEROTIER";
const VERSION: u32 = 1;
const FIELDS_BYTES: usize = 8 + 4 * 4 + 16 + 8 * 5;

/// Who a tier file belongs to and what it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TierHeader {
    /// The rank whose states it holds, in a group of `world`.
    pub rank: u32,
    /// The group's size.
    pub world: u32,
    /// The tier's name (`optimizer`, `params`), at most 16 bytes.
    pub tier: [u8; 16],
    /// The run that made it (a value each run draws at start-up).
    pub run: u64,
    /// Pieces it holds.
    pub pieces: u64,
    /// FNV-1a of the pieces' lengths, in order.
    pub layout: u64,
    /// Bytes after the header (every piece's slot).
    pub payload: u64,
}

/// FNV-1a 64 of `bytes`, continuing from `hash`.
pub(crate) fn fnv1a(hash: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(hash, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// FNV-1a's starting value.
pub(crate) const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

impl TierHeader {
    /// The header as its [`HEADER_BYTES`] bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_BYTES);
        out.extend_from_slice(MAGIC);
        for v in [VERSION, self.rank, self.world, 0] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&self.tier);
        for v in [self.run, self.pieces, self.layout, self.payload] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        let sum = fnv1a(FNV_OFFSET, &out);
        out.extend_from_slice(&sum.to_le_bytes());
        out.resize(HEADER_BYTES, 0);
        out
    }

    /// Reads a header back; `Err` says what is wrong (not a tier file, another version, a
    /// checksum that does not match).
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        if bytes.len() < FIELDS_BYTES || &bytes[..8] != MAGIC {
            return Err("not a zero tier file (no ZEROTIER magic)".into());
        }
        let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4"));
        let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8"));
        if u32_at(8) != VERSION {
            return Err(format!(
                "version {} (this build reads {VERSION})",
                u32_at(8)
            ));
        }
        let sum_at = FIELDS_BYTES - 8;
        if fnv1a(FNV_OFFSET, &bytes[..sum_at]) != u64_at(sum_at) {
            return Err("its header's checksum does not match".into());
        }
        let mut tier = [0u8; 16];
        tier.copy_from_slice(&bytes[24..40]);
        Ok(Self {
            rank: u32_at(12),
            world: u32_at(16),
            tier,
            run: u64_at(40),
            pieces: u64_at(48),
            layout: u64_at(56),
            payload: u64_at(64),
        })
    }

    /// The first field in which `self` (found) differs from `want`: its name, the expected
    /// and the found value.
    pub fn first_difference(&self, want: &Self) -> Option<(&'static str, String, String)> {
        let name = |t: &[u8; 16]| {
            String::from_utf8_lossy(t)
                .trim_end_matches('\0')
                .to_string()
        };
        let fields: [(&'static str, String, String); 7] = [
            ("tier", name(&want.tier), name(&self.tier)),
            ("rank", want.rank.to_string(), self.rank.to_string()),
            ("world size", want.world.to_string(), self.world.to_string()),
            (
                "run",
                format!("{:#x}", want.run),
                format!("{:#x}", self.run),
            ),
            ("pieces", want.pieces.to_string(), self.pieces.to_string()),
            (
                "layout",
                format!("{:#x}", want.layout),
                format!("{:#x}", self.layout),
            ),
            (
                "payload bytes",
                want.payload.to_string(),
                self.payload.to_string(),
            ),
        ];
        fields.into_iter().find(|(_, w, f)| w != f)
    }
}

impl fmt::Display for TierHeader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tier = String::from_utf8_lossy(&self.tier);
        write!(
            f,
            "tier {} of rank {}/{}, run {:#x}, {} pieces",
            tier.trim_end_matches('\0'),
            self.rank,
            self.world,
            self.run,
            self.pieces
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> TierHeader {
        let mut tier = [0u8; 16];
        tier[..9].copy_from_slice(b"optimizer");
        TierHeader {
            rank: 3,
            world: 8,
            tier,
            run: 0xfeed,
            pieces: 5,
            layout: 0x1234,
            payload: 1 << 20,
        }
    }

    #[test]
    fn a_header_reads_back_and_a_flipped_byte_is_refused() {
        let bytes = header().encode();
        assert_eq!(bytes.len(), HEADER_BYTES);
        assert_eq!(TierHeader::decode(&bytes), Ok(header()));
        for at in 0..FIELDS_BYTES {
            let mut bad = bytes.clone();
            bad[at] ^= 0x40;
            assert!(TierHeader::decode(&bad).is_err(), "byte {at}");
        }
        assert!(TierHeader::decode(&bytes[..10]).is_err());
    }

    #[test]
    fn the_checksum_is_the_one_an_independent_encoder_computes() {
        // Computed by Python's struct and a hand-written FNV-1a loop (scripts/fuzz.sh seeds
        // the tier_header target with the same header).
        let mut tier = [0u8; 16];
        tier[..9].copy_from_slice(b"optimizer");
        let h = TierHeader {
            rank: 1,
            world: 2,
            tier,
            run: 9,
            pieces: 2,
            layout: 7,
            payload: 8192,
        };
        let bytes = h.encode();
        assert_eq!(&bytes[72..80], &0xa598_6355_35b0_02b4u64.to_le_bytes());
    }

    #[test]
    fn the_first_difference_names_the_field() {
        let other = TierHeader { run: 7, ..header() };
        let (what, want, found) = other.first_difference(&header()).unwrap();
        assert_eq!(
            (what, want.as_str(), found.as_str()),
            ("run", "0xfeed", "0x7")
        );
        assert_eq!(header().first_difference(&header()), None);
    }
}
