//! Link rates as `tc` writes them (`1gbit`, `250mbit`, `12.5mbps`): the rate that
//! `zero-train plan --link-rate` prices a step's traffic at, spelled as `scripts/cluster.sh up`
//! takes it, so one string sets both the emulated link and the estimate.

use std::fmt;
use std::str::FromStr;

/// A link's rate in bits per second, each way (a full-duplex link).
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub struct LinkRate {
    bits_per_s: f64,
}

/// Why a link rate could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid link rate {text:?}: {reason}")]
pub struct LinkRateError {
    /// The text that was given.
    pub text: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

/// tc(8)'s rate units: bits, or bytes (`bps`), with decimal prefixes.
const UNITS: [(&str, f64); 10] = [
    ("tbit", 1e12),
    ("gbit", 1e9),
    ("mbit", 1e6),
    ("kbit", 1e3),
    ("bit", 1.0),
    ("tbps", 8e12),
    ("gbps", 8e9),
    ("mbps", 8e6),
    ("kbps", 8e3),
    ("bps", 8.0),
];

/// The range accepted: what a token bucket on a veth can be set to, give or take.
const MIN_BITS: f64 = 8e3;
const MAX_BITS: f64 = 1e12;

impl LinkRate {
    /// The rate in bits per second.
    pub fn bits_per_s(self) -> f64 {
        self.bits_per_s
    }

    /// Seconds to move `bytes` over the link one way.
    pub fn seconds(self, bytes: u64) -> f64 {
        bytes as f64 * 8.0 / self.bits_per_s
    }
}

impl FromStr for LinkRate {
    type Err = LinkRateError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let err = |reason| LinkRateError {
            text: text.to_string(),
            reason,
        };
        let lower = text.trim().to_ascii_lowercase();
        let (digits, scale) = UNITS
            .iter()
            .find_map(|&(unit, scale)| lower.strip_suffix(unit).map(|d| (d, scale)))
            .ok_or_else(|| {
                err(
                    "expected a number and a tc unit: bit, kbit, mbit, gbit, tbit, or bps, \
                     kbps, mbps, gbps, tbps (bytes); e.g. 1gbit, 250mbit",
                )
            })?;
        // Plain decimals only: no sign, exponent, inf or NaN, which f64's parser would take.
        let plain = !digits.is_empty()
            && digits.bytes().all(|b| b.is_ascii_digit() || b == b'.')
            && digits.bytes().filter(|&b| b == b'.').count() <= 1
            && digits.bytes().any(|b| b.is_ascii_digit());
        if !plain {
            return Err(err(
                "the number must be plain decimal digits, e.g. 1 or 12.5",
            ));
        }
        let value: f64 = digits.parse().map_err(|_| err("unreadable number"))?;
        let bits_per_s = value * scale;
        if !(MIN_BITS..=MAX_BITS).contains(&bits_per_s) {
            return Err(err("out of range: from 8kbit to 1tbit"));
        }
        Ok(Self { bits_per_s })
    }
}

impl fmt::Display for LinkRate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.bits_per_s;
        match b {
            b if b >= 1e9 => write!(f, "{} Gbit/s", b / 1e9),
            b if b >= 1e6 => write!(f, "{} Mbit/s", b / 1e6),
            b => write!(f, "{} kbit/s", b / 1e3),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bits(s: &str) -> f64 {
        s.parse::<LinkRate>().unwrap().bits_per_s()
    }

    #[test]
    fn reads_tc_units_in_bits_and_bytes() {
        assert_eq!(bits("1gbit"), 1e9);
        assert_eq!(bits("250mbit"), 250e6);
        assert_eq!(bits("250Mbit"), 250e6);
        assert_eq!(bits("12.5mbps"), 100e6);
        assert_eq!(bits("8kbit"), 8e3);
    }

    #[test]
    fn refuses_what_tc_would_not_take_or_we_cannot_price() {
        for bad in [
            "", "1", "gbit", "1 gbit x", "-1gbit", "1e3mbit", "infgbit", "nangbit", "1..2gbit",
            "0gbit", "1bit", "20tbit", "1gbit/s",
        ] {
            let e = bad.parse::<LinkRate>().unwrap_err();
            assert_eq!(e.text, bad);
        }
    }

    #[test]
    fn prices_bytes_at_the_rate() {
        let r: LinkRate = "1gbit".parse().unwrap();
        assert_eq!(r.seconds(125_000_000), 1.0);
        assert_eq!(r.to_string(), "1 Gbit/s");
    }
}
