//! The variables torchrun (and launchers that imitate it) set for every process.

use crate::error::{CommError, Result};

/// Where this process sits in the job, as torchrun describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchEnv {
    /// `RANK`: this process's rank, in `0..world_size`.
    pub rank: usize,
    /// `WORLD_SIZE`: number of processes, at least 1, at most `i32::MAX` (NCCL counts in C ints).
    pub world_size: usize,
    /// `LOCAL_RANK`: this process's index on its machine (the GPU it drives).
    pub local_rank: usize,
    /// `MASTER_ADDR`: host name or address where rank 0 listens.
    pub master_addr: String,
    /// `MASTER_PORT`: the port rank 0 listens on, in `1..=65535`.
    pub master_port: u16,
}

fn bad(var: &'static str, why: String) -> CommError {
    CommError::Launch { var, why }
}

fn number(get: &dyn Fn(&str) -> Option<String>, var: &'static str) -> Result<usize> {
    let raw = get(var).ok_or_else(|| bad(var, "is not set".into()))?;
    let text = raw.trim();
    // `usize::from_str` accepts a leading '+'; a launcher never writes one, so refuse it.
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad(var, format!("{raw:?} is not a non-negative integer")));
    }
    text.parse()
        .map_err(|_| bad(var, format!("{raw:?} is too large")))
}

impl LaunchEnv {
    /// Reads `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR` and `MASTER_PORT` from the
    /// process environment.
    ///
    /// # Errors
    /// [`CommError::Launch`] naming the first variable that is missing, malformed or out of range.
    pub fn from_env() -> Result<LaunchEnv> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// As [`LaunchEnv::from_env`], reading variables through `get` (for tests and for
    /// programs that take them from elsewhere).
    ///
    /// # Errors
    /// As [`LaunchEnv::from_env`].
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<LaunchEnv> {
        let world_size = number(&get, "WORLD_SIZE")?;
        if world_size == 0 || i32::try_from(world_size).is_err() {
            return Err(bad(
                "WORLD_SIZE",
                format!("{world_size} is out of range 1..={}", i32::MAX),
            ));
        }
        let rank = number(&get, "RANK")?;
        if rank >= world_size {
            return Err(bad(
                "RANK",
                format!("{rank} is not below WORLD_SIZE {world_size}"),
            ));
        }
        let local_rank = number(&get, "LOCAL_RANK")?;
        if local_rank >= world_size {
            return Err(bad(
                "LOCAL_RANK",
                format!("{local_rank} is not below WORLD_SIZE {world_size}"),
            ));
        }
        let master_addr = get("MASTER_ADDR")
            .map(|a| a.trim().to_string())
            .ok_or_else(|| bad("MASTER_ADDR", "is not set".into()))?;
        if master_addr.is_empty() {
            return Err(bad("MASTER_ADDR", "is empty".into()));
        }
        let port = number(&get, "MASTER_PORT")?;
        let master_port = u16::try_from(port)
            .ok()
            .filter(|&p| p != 0)
            .ok_or_else(|| bad("MASTER_PORT", format!("{port} is out of range 1..=65535")))?;
        Ok(LaunchEnv {
            rank,
            world_size,
            local_rank,
            master_addr,
            master_port,
        })
    }

    /// `MASTER_ADDR:MASTER_PORT`, bracketing an IPv6 literal.
    pub fn master(&self) -> String {
        if self.master_addr.contains(':') && !self.master_addr.starts_with('[') {
            format!("[{}]:{}", self.master_addr, self.master_port)
        } else {
            format!("{}:{}", self.master_addr, self.master_port)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Result<LaunchEnv> {
        let map: std::collections::HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        LaunchEnv::from_lookup(|k| map.get(k).cloned())
    }

    const GOOD: [(&str, &str); 5] = [
        ("RANK", "3"),
        ("WORLD_SIZE", "8"),
        ("LOCAL_RANK", "3"),
        ("MASTER_ADDR", "node1"),
        ("MASTER_PORT", "29500"),
    ];

    fn with(var: &str, value: Option<&str>) -> Result<LaunchEnv> {
        let pairs: Vec<(&str, &str)> = GOOD
            .iter()
            .filter(|(k, _)| *k != var)
            .copied()
            .chain(value.map(|v| (var, v)))
            .collect();
        env(&pairs)
    }

    fn failing_var(r: Result<LaunchEnv>) -> (&'static str, String) {
        match r {
            Err(CommError::Launch { var, why }) => (var, why),
            other => panic!("expected a Launch error, got {other:?}"),
        }
    }

    #[test]
    fn a_torchrun_environment_parses() {
        let e = env(&GOOD).unwrap();
        assert_eq!((e.rank, e.world_size, e.local_rank), (3, 8, 3));
        assert_eq!(e.master(), "node1:29500");
    }

    #[test]
    fn each_missing_variable_is_named() {
        for (var, _) in GOOD {
            let (named, why) = failing_var(with(var, None));
            assert_eq!(named, var);
            assert!(why.contains("not set"), "{why}");
        }
    }

    #[test]
    fn malformed_numbers_are_refused_with_their_text() {
        for value in [
            "",
            "x",
            "-1",
            "+2",
            "1.5",
            "0x10",
            "99999999999999999999999",
        ] {
            for var in ["RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"] {
                let (named, why) = failing_var(with(var, Some(value)));
                assert_eq!(named, var, "{var}={value:?}");
                assert!(why.contains(&format!("{value:?}")), "{why}");
            }
        }
    }

    #[test]
    fn out_of_range_values_are_refused() {
        assert_eq!(failing_var(with("RANK", Some("8"))).0, "RANK");
        assert_eq!(failing_var(with("LOCAL_RANK", Some("8"))).0, "LOCAL_RANK");
        assert_eq!(failing_var(with("WORLD_SIZE", Some("0"))).0, "WORLD_SIZE");
        assert_eq!(
            failing_var(with("WORLD_SIZE", Some("2147483648"))).0,
            "WORLD_SIZE"
        );
        assert_eq!(failing_var(with("MASTER_PORT", Some("0"))).0, "MASTER_PORT");
        assert_eq!(
            failing_var(with("MASTER_PORT", Some("65536"))).0,
            "MASTER_PORT"
        );
        assert_eq!(failing_var(with("MASTER_ADDR", Some(" "))).0, "MASTER_ADDR");
        // The edges that are allowed.
        assert_eq!(with("RANK", Some("7")).unwrap().rank, 7);
        assert_eq!(
            with("MASTER_PORT", Some("65535")).unwrap().master_port,
            65535
        );
    }

    #[test]
    fn ipv6_literals_are_bracketed() {
        let e = with("MASTER_ADDR", Some("::1")).unwrap();
        assert_eq!(e.master(), "[::1]:29500");
    }
}
