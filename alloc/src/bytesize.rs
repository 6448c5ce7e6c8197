//! Byte counts as users write them: `1048576`, `512K`, `16G` (powers of 1024, like nccl-tests).
//! With feature `serde`, a count reads from a number or such a string in a config file.

use std::fmt;
use std::str::FromStr;

/// A byte count parsed from a plain number or one with a K/M/G/T suffix (powers of 1024).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ByteSize(pub u64);

/// Why a byte count could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid byte count {text:?}: {reason}")]
pub struct ByteSizeError {
    /// The text that was given.
    pub text: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl FromStr for ByteSize {
    type Err = ByteSizeError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let err = || ByteSizeError {
            text: text.to_string(),
            reason: "expected a number with an optional K, M, G or T suffix (powers of 1024)",
        };
        let too_large = || ByteSizeError {
            text: text.to_string(),
            reason: "more than 2^64 - 1 bytes",
        };
        let trimmed = text.trim();
        let trimmed = trimmed
            .strip_suffix(['B', 'b'])
            .filter(|t| t.ends_with(|c: char| c.is_ascii_alphabetic()))
            .unwrap_or(trimmed);
        let (digits, shift) = match trimmed.chars().last().map(|c| c.to_ascii_uppercase()) {
            Some('K') => (&trimmed[..trimmed.len() - 1], 10),
            Some('M') => (&trimmed[..trimmed.len() - 1], 20),
            Some('G') => (&trimmed[..trimmed.len() - 1], 30),
            Some('T') => (&trimmed[..trimmed.len() - 1], 40),
            _ => (trimmed, 0),
        };
        let digits = digits.trim();
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(err());
        }
        // All digits: the only way left to fail is a value past u64.
        let value: u64 = digits.parse().map_err(|_| too_large())?;
        value
            .checked_mul(1u64 << shift)
            .map(ByteSize)
            .ok_or_else(too_large)
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [(&str, u32); 4] = [("T", 40), ("G", 30), ("M", 20), ("K", 10)];
        for (suffix, shift) in UNITS {
            let unit = 1u64 << shift;
            if self.0 >= unit && self.0 % unit == 0 {
                return write!(f, "{}{suffix}", self.0 / unit);
            }
        }
        write!(f, "{}", self.0)
    }
}

#[cfg(feature = "serde")]
mod serde_impls {
    use super::ByteSize;
    use serde::{de, Deserialize, Deserializer, Serialize, Serializer};
    use std::fmt;

    impl Serialize for ByteSize {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_u64(self.0)
        }
    }

    impl<'de> Deserialize<'de> for ByteSize {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct Visitor;
            impl de::Visitor<'_> for Visitor {
                type Value = ByteSize;
                fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    f.write_str("a byte count such as 1048576 or \"16G\"")
                }
                fn visit_u64<E: de::Error>(self, v: u64) -> Result<ByteSize, E> {
                    Ok(ByteSize(v))
                }
                fn visit_i64<E: de::Error>(self, v: i64) -> Result<ByteSize, E> {
                    u64::try_from(v)
                        .map(ByteSize)
                        .map_err(|_| E::custom(format!("negative byte count {v}")))
                }
                fn visit_str<E: de::Error>(self, v: &str) -> Result<ByteSize, E> {
                    v.parse().map_err(E::custom)
                }
            }
            d.deserialize_any(Visitor)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suffixes_are_powers_of_1024() {
        assert_eq!("512".parse(), Ok(ByteSize(512)));
        assert_eq!("4K".parse(), Ok(ByteSize(4096)));
        assert_eq!("16g".parse(), Ok(ByteSize(16 << 30)));
        assert_eq!("2MB".parse(), Ok(ByteSize(2 << 20)));
        assert_eq!("1T".parse(), Ok(ByteSize(1 << 40)));
    }

    #[test]
    fn garbage_and_overflow_are_errors() {
        for bad in ["", "K", "-1", "+1", "1.5G", "12Q"] {
            let err = bad.parse::<ByteSize>().unwrap_err();
            assert!(
                err.reason.starts_with("expected a number"),
                "{bad:?}: {err}"
            );
        }
        // 2^24 T = 2^64 bytes, one past u64::MAX; and a number past u64 itself.
        for bad in ["16777216T", "99999999999T", "18446744073709551616"] {
            let err = bad.parse::<ByteSize>().unwrap_err();
            assert!(err.reason.contains("2^64"), "{bad:?}: {err}");
        }
        assert_eq!("16777215T".parse(), Ok(ByteSize(16_777_215 << 40)));
    }

    #[test]
    fn display_round_trips() {
        for n in [0u64, 1, 1000, 1024, 3 << 20, 5 << 30, (1 << 30) + 1] {
            let shown = ByteSize(n).to_string();
            assert_eq!(shown.parse(), Ok(ByteSize(n)), "{shown}");
        }
    }
}
