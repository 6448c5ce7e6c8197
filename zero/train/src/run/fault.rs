//! `--inject-fault KIND:rank=R,step=S[,op=NAME][,seq=N][,attempt=K]`: faults injected on
//! purpose, as the user types them, and when each one fires (docs/faults.md).
//!
//! The parser is pure (text in, [`FaultSpec`] or a message naming the flag out), so it is
//! tested apart from any rank; [`due`] says which specs a rank arms at a step of an attempt.
//! What a fault then does at a collective is zero-comm's ([`zero_comm::fault`]); `diverge`
//! is the trainer's own (it makes a call out of the declared unit order).

use serde::{Deserialize, Serialize};
use std::time::Duration;
use zero_comm::{Fault, FaultAction, OpKind};

/// The environment variable that adds faults to launched ranks, `;`-separated specs.
pub const FAULT_ENV: &str = "ZERO_INJECT_FAULT";
/// The launcher's attempt counter (torchelastic's name): 0 on the first start.
pub const RESTART_COUNT_ENV: &str = "TORCHELASTIC_RESTART_COUNT";
/// Longest `slow=MS` pause taken (one hour): a longer one is a typo, not a slow rank.
const MAX_SLOW_MS: u64 = 3_600_000;

/// What a fault does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// The rank's process exits as if killed (its thread leaves, on the local backend).
    Kill,
    /// The rank stops answering inside a collective.
    Hang,
    /// The rank sleeps this many milliseconds before each collective.
    Slow(u64),
    /// The rank flips a bit of a collective's result.
    Corrupt,
    /// The rank makes a call out of the declared unit order.
    Diverge,
}

/// One `--inject-fault` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FaultSpec {
    /// What happens.
    pub kind: FaultKind,
    /// On which rank.
    pub rank: usize,
    /// From which step (counted from 0, as the loop counts).
    pub step: u64,
    /// Only at this kind of collective.
    pub op: Option<OpKind>,
    /// Only at a collective of at least this sequence number.
    pub seq: Option<u64>,
    /// Only in this attempt of a launcher's restarts (0: the first start).
    pub attempt: u64,
}

impl FaultSpec {
    /// The collective-level fault zero-comm arms, or `None` for `diverge`.
    pub fn comm_fault(&self) -> Option<Fault> {
        let action = match self.kind {
            FaultKind::Kill => FaultAction::Kill,
            FaultKind::Hang => FaultAction::Hang,
            FaultKind::Slow(ms) => FaultAction::Slow(Duration::from_millis(ms)),
            FaultKind::Corrupt => FaultAction::Corrupt,
            FaultKind::Diverge => return None,
        };
        Some(Fault {
            action,
            op: self.op,
            min_seq: self.seq.unwrap_or(0),
        })
    }
}

/// The specs `rank` arms at the start of `step` in launcher attempt `attempt`.
pub fn due(specs: &[FaultSpec], rank: usize, step: u64, attempt: u64) -> Vec<FaultSpec> {
    specs
        .iter()
        .filter(|s| s.rank == rank && s.step == step && s.attempt == attempt)
        .copied()
        .collect()
}

impl std::str::FromStr for FaultSpec {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        parse(text).map_err(|why| format!("--inject-fault {text:?}: {why}"))
    }
}

/// [`FaultSpec::from_str`] without the flag's name.
fn parse(text: &str) -> Result<FaultSpec, String> {
    let (kind, fields) = text
        .trim()
        .split_once(':')
        .ok_or("expected KIND:rank=R,step=S (KIND: kill, hang, slow=MS, corrupt, diverge)")?;
    let kind = parse_kind(kind.trim())?;
    let (mut rank, mut step, mut op, mut seq, mut attempt) = (None, None, None, None, None);
    for field in fields.split(',').map(str::trim).filter(|f| !f.is_empty()) {
        let (key, value) = field
            .split_once('=')
            .ok_or_else(|| format!("{field:?} is not KEY=VALUE"))?;
        let (key, value) = (key.trim(), value.trim());
        let slot_taken = match key {
            "rank" => rank.replace(number(key, value)?).is_some(),
            "step" => step.replace(number(key, value)?).is_some(),
            "seq" => seq.replace(number(key, value)?).is_some(),
            "attempt" => attempt.replace(number(key, value)?).is_some(),
            "op" => op.replace(parse_op(value)?).is_some(),
            _ => {
                return Err(format!(
                    "unknown key {key:?} (keys: rank, step, op, seq, attempt)"
                ))
            }
        };
        if slot_taken {
            return Err(format!("{key} is given twice"));
        }
    }
    let rank = rank.ok_or("rank=R is required")?;
    Ok(FaultSpec {
        kind,
        rank: usize::try_from(rank)
            .map_err(|_| format!("rank={rank} is past this machine's ranks"))?,
        step: step.ok_or("step=S is required")?,
        op,
        seq,
        attempt: attempt.unwrap_or(0),
    })
}

/// `value` as a u64, or a message naming `key`.
fn number(key: &str, value: &str) -> Result<u64, String> {
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{key}={value:?} is not a whole number"));
    }
    value
        .parse::<u64>()
        .map_err(|_| format!("{key}={value} is past the largest value, {}", u64::MAX))
}

fn parse_kind(kind: &str) -> Result<FaultKind, String> {
    match kind {
        "kill" => Ok(FaultKind::Kill),
        "hang" => Ok(FaultKind::Hang),
        "corrupt" => Ok(FaultKind::Corrupt),
        "diverge" => Ok(FaultKind::Diverge),
        _ => match kind.strip_prefix("slow=") {
            Some(ms) => match number("slow", ms)? {
                ms if ms <= MAX_SLOW_MS => Ok(FaultKind::Slow(ms)),
                ms => Err(format!("slow={ms} ms is past the {MAX_SLOW_MS} ms allowed")),
            },
            None => Err(format!(
                "unknown fault {kind:?} (kinds: kill, hang, slow=MS, corrupt, diverge)"
            )),
        },
    }
}

fn parse_op(name: &str) -> Result<OpKind, String> {
    OpKind::ALL
        .into_iter()
        .find(|k| k.name() == name)
        .ok_or_else(|| {
            let names: Vec<&str> = OpKind::ALL.iter().map(|k| k.name()).collect();
            format!("op={name:?} is not a collective ({})", names.join(", "))
        })
}

impl std::fmt::Display for FaultSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.kind {
            FaultKind::Kill => f.write_str("kill")?,
            FaultKind::Hang => f.write_str("hang")?,
            FaultKind::Slow(ms) => write!(f, "slow={ms}")?,
            FaultKind::Corrupt => f.write_str("corrupt")?,
            FaultKind::Diverge => f.write_str("diverge")?,
        }
        write!(f, ":rank={},step={}", self.rank, self.step)?;
        if let Some(op) = self.op {
            write!(f, ",op={op}")?;
        }
        if let Some(seq) = self.seq {
            write!(f, ",seq={seq}")?;
        }
        write!(f, ",attempt={}", self.attempt)
    }
}

impl Serialize for FaultSpec {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for FaultSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// The specs of `ZERO_INJECT_FAULT` (none when unset).
///
/// # Errors
/// A spec that does not parse, naming the variable.
pub fn from_env() -> Result<Vec<FaultSpec>, String> {
    let Some(value) = std::env::var_os(FAULT_ENV) else {
        return Ok(Vec::new());
    };
    let value = value
        .into_string()
        .map_err(|v| format!("{FAULT_ENV}={v:?} is not UTF-8"))?;
    value
        .split(';')
        .filter(|s| !s.trim().is_empty())
        .map(|s| parse(s).map_err(|why| format!("{FAULT_ENV} {s:?}: {why}")))
        .collect()
}

/// The launcher's attempt number from `TORCHELASTIC_RESTART_COUNT` (0 when unset).
///
/// # Errors
/// A value that is not a whole number.
pub fn attempt_from_env() -> Result<u64, String> {
    match std::env::var(RESTART_COUNT_ENV) {
        Err(_) => Ok(0),
        Ok(v) => number(RESTART_COUNT_ENV, v.trim()),
    }
}

#[cfg(test)]
mod tests;
