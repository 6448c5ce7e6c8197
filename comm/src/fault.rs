//! Faults injected on purpose, and the checks that name them.
//!
//! A caller arms [`Fault`]s on its communicator ([`Communicator::inject`]); each fires at the
//! first collective after it was armed whose kind and sequence number match.
//! What it does (one hook in [`execute`](crate::communicator), so every backend sees the
//! same faults):
//!
//! 1. `Kill`: a rank that shares its process with others (the `local` backend's threads)
//!    drops out of the group as a killed process's sockets would close, and its call fails
//!    with [`CommError::Injected`]; a rank that is its own process (TCP, MPI) prints one line
//!    naming the fault and exits with status 137, a SIGKILL's status in a shell.
//! 2. `Hang`: the rank stops answering inside the collective for twice the group's timeout
//!    (so its peers time out first), then leaves with [`CommError::Injected`].
//! 3. `Slow`: the rank sleeps before every matching collective; nothing fails.
//! 4. `Corrupt`: once the collective has completed, the rank flips the top mantissa bit of
//!    the largest-magnitude element of its result (never a zero padding element, so the
//!    change is real), as a bad receive would. By default it picks the first
//!    collective whose result every rank holds whole (all-reduce, all-gather, broadcast), so
//!    that checksums and fingerprints can see it.
//!
//! With [`Config::checksums`](crate::Config::checksums), every collective whose result every
//! rank holds whole is followed by a 32-byte all-gather of each rank's 64-bit hash of its
//! result; ranks whose hash differs from the majority's are named in [`CommError::Corrupt`].
//! (Reduce-scatter and reduce leave each rank a different result, so there is nothing to
//! compare across ranks: they are not checked.)

use std::sync::Arc;
use std::time::Duration;

use crate::backend::Leave;
use crate::communicator::{lock, run_unchecked, Collective, Communicator, Inner};
use crate::element::Element;
use crate::error::{CommError, Result};
use crate::op::{OpDesc, OpKind};

/// Exit status of a rank process that an injected `Kill` ends (128 + SIGKILL).
pub const KILLED_EXIT_STATUS: i32 = 137;

/// What an injected fault does; see the module documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultAction {
    /// The rank dies.
    Kill,
    /// The rank stops answering.
    Hang,
    /// The rank sleeps this long before each matching collective.
    Slow(Duration),
    /// The rank flips a bit of one collective's result.
    Corrupt,
}

impl FaultAction {
    /// Its name in messages (`kill`, `hang`, `slow`, `corrupt`).
    pub fn name(self) -> &'static str {
        match self {
            FaultAction::Kill => "kill",
            FaultAction::Hang => "hang",
            FaultAction::Slow(_) => "slow",
            FaultAction::Corrupt => "corrupt",
        }
    }
}

/// A fault to fire at a collective of this rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    /// What it does.
    pub action: FaultAction,
    /// Only this kind of collective (`None`: any; for `Corrupt`, any whose result is whole
    /// on every rank).
    pub op: Option<OpKind>,
    /// Only collectives with at least this sequence number.
    pub min_seq: u64,
}

impl Fault {
    /// True when the fault fires at `desc`.
    pub fn matches(&self, desc: &OpDesc) -> bool {
        let kind_ok = match (self.op, self.action) {
            (Some(kind), _) => kind == desc.kind,
            (None, FaultAction::Corrupt) => replicated_result(desc.kind),
            (None, _) => true,
        };
        kind_ok && desc.seq >= self.min_seq
    }
}

/// True for collectives after which every rank holds the same whole result.
pub(crate) fn replicated_result(kind: OpKind) -> bool {
    matches!(
        kind,
        OpKind::AllReduce | OpKind::AllGather | OpKind::Broadcast
    )
}

/// A fault armed on one communicator, with what it needs to fire.
#[derive(Debug)]
pub(crate) struct Armed {
    pub fault: Fault,
    pub leave: Arc<dyn Leave>,
    pub timeout: Duration,
    pub backend: &'static str,
}

/// Runs the armed faults' `Slow`, `Kill` and `Hang` before `desc` reaches the backend, in
/// the order they were armed; `Corrupt` waits for the result ([`corrupt_result`]). `Kill` and
/// `Hang` end the rank's part, so they fire once; `Slow` stays armed.
pub(crate) fn before_op(armed: &mut Vec<Armed>, rank: usize, desc: &OpDesc) -> Result<()> {
    let injected = |action: FaultAction| CommError::Injected {
        fault: action.name(),
        rank,
        op: desc.kind,
        seq: desc.seq,
    };
    for i in 0..armed.len() {
        let a = &armed[i];
        if !a.fault.matches(desc) {
            continue;
        }
        match a.fault.action {
            FaultAction::Slow(pause) => std::thread::sleep(pause),
            FaultAction::Corrupt => {}
            FaultAction::Kill => {
                let a = armed.remove(i);
                if !shares_process(a.backend) {
                    eprintln!("zero-comm: {}: exiting", injected(FaultAction::Kill));
                    std::process::exit(KILLED_EXIT_STATUS);
                }
                a.leave.leave(false);
                return Err(injected(FaultAction::Kill));
            }
            FaultAction::Hang => {
                let a = armed.remove(i);
                std::thread::sleep(a.timeout.saturating_mul(2));
                a.leave.leave(false);
                return Err(injected(FaultAction::Hang));
            }
        }
    }
    Ok(())
}

/// True for backends whose ranks are threads of one process.
fn shares_process(backend: &str) -> bool {
    matches!(backend, "local" | "device_local")
}

/// Fires the first armed `Corrupt` that matches `desc`: flips one significant bit
/// ([`Element::flip_bit`]: bit 22, the top mantissa bit of an f32, exact through bf16 and
/// f16; f64's top mantissa bit) of the largest-magnitude element of `result` (the first of
/// equals), and disarms it.
pub(crate) fn corrupt_result<T: Element>(armed: &mut Vec<Armed>, desc: &OpDesc, result: &mut [T]) {
    let Some(fires) = armed
        .iter()
        .position(|a| a.fault.action == FaultAction::Corrupt && a.fault.matches(desc))
    else {
        // The common case: nothing armed fires, so the result is not read at all.
        return;
    };
    let largest = (0..result.len()).fold(None, |best: Option<usize>, i| match best {
        Some(b) if result[b].magnitude() >= result[i].magnitude() => Some(b),
        _ => Some(i),
    });
    if let Some(i) = largest {
        armed.remove(fires);
        result[i] = result[i].flip_bit();
    }
}

impl Communicator {
    /// Arms `fault` on this rank, beside those armed before: it fires at the first later
    /// collective it matches (see [`crate::fault`]).
    pub fn inject(&self, fault: Fault) {
        self.drain();
        lock(&self.inner).faults.push(Armed {
            fault,
            leave: Arc::clone(&self.leave),
            timeout: self.config().timeout,
            backend: self.backend(),
        });
    }

    /// Every rank's `value`, in rank order (one all-gather of four f32 words per rank).
    /// Collective.
    ///
    /// # Errors
    /// As [`Communicator::all_gather`].
    pub fn gather_hashes(&self, value: u64) -> Result<Vec<u64>> {
        self.drain();
        gather_hashes(&mut lock(&self.inner), value)
    }
}

/// Every rank's `value`, in rank order, on `inner`'s group, without result checks.
fn gather_hashes(inner: &mut Inner, value: u64) -> Result<Vec<u64>> {
    let words = hash_to_words(value);
    let mut all = vec![0f32; 4 * inner.backend.size()];
    run_unchecked(inner, Collective::AllGather, Some(&words[..]), &mut all)?;
    Ok(all.chunks(4).map(words_to_hash).collect())
}

/// Compares `result`'s hash across ranks after `desc`: [`CommError::Corrupt`] naming the
/// ranks that differ from the majority.
pub(crate) fn check_result<T: Element>(
    inner: &mut Inner,
    desc: &OpDesc,
    result: &[T],
) -> Result<()> {
    let mine = hash_words(result.iter().map(|v| v.hash_bits()));
    let ranks = outliers(&gather_hashes(inner, mine)?);
    if ranks.is_empty() {
        return Ok(());
    }
    Err(CommError::Corrupt {
        op: desc.kind,
        seq: desc.seq,
        rank: inner.backend.rank(),
        ranks,
        history: Box::new(lock(&inner.recorder).history.clone()),
    })
}

/// An FNV-style hash over the 32-bit patterns of `values` (halves widened exactly to f32
/// first), one word per step: `h = (h ^ word) * p` is a bijection of `h` for each word, so
/// changing any one value changes the hash. (Byte-wise FNV-1a cost four times the
/// multiplications for nothing here.)
pub fn hash_f32_bits(values: impl IntoIterator<Item = f32>) -> u64 {
    hash_words(values.into_iter().map(|v| u64::from(v.to_bits())))
}

/// The hash of [`hash_f32_bits`] over words of any width ([`Element::hash_bits`]: an f32's
/// pattern for the f32 family, so their hashes are unchanged; 32 or 64 bits otherwise).
pub fn hash_words(words: impl IntoIterator<Item = u64>) -> u64 {
    words.into_iter().fold(0xcbf2_9ce4_8422_2325, |h: u64, w| {
        (h ^ w).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A 64-bit value as four f32 words of 16 bits each: every word is an integer below 2^16,
/// exact in f32, so a collective moves it unchanged whatever the backend does with floats.
pub fn hash_to_words(h: u64) -> [f32; 4] {
    std::array::from_fn(|i| ((h >> (16 * i)) & 0xffff) as f32)
}

/// The inverse of [`hash_to_words`].
pub fn words_to_hash(words: &[f32]) -> u64 {
    words
        .iter()
        .take(4)
        .enumerate()
        .fold(0, |h, (i, w)| h | (u64::from(*w as u16) << (16 * i)))
}

/// The ranks whose value differs from the value a strict majority of ranks hold; every rank
/// when no value has a strict majority (two ranks that disagree cannot say which is right);
/// none when all agree.
pub fn outliers(values: &[u64]) -> Vec<usize> {
    let majority = values
        .iter()
        .find(|v| 2 * values.iter().filter(|w| w == v).count() > values.len());
    match majority {
        Some(m) => (0..values.len()).filter(|&r| values[r] != *m).collect(),
        None if values.windows(2).all(|w| w[0] == w[1]) => Vec::new(),
        None => (0..values.len()).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn outliers_name_the_odd_rank_out_or_everyone_without_a_majority() {
        assert_eq!(outliers(&[5, 5, 5]), Vec::<usize>::new());
        assert_eq!(outliers(&[5, 7, 5]), vec![1]);
        assert_eq!(outliers(&[7, 5, 5, 5]), vec![0]);
        assert_eq!(outliers(&[5, 7]), vec![0, 1]);
        assert_eq!(outliers(&[1, 1, 2, 2]), vec![0, 1, 2, 3]);
        assert_eq!(outliers(&[]), Vec::<usize>::new());
    }

    #[test]
    fn a_default_corrupt_skips_collectives_whose_results_differ_by_rank() {
        let fault = Fault {
            action: FaultAction::Corrupt,
            op: None,
            min_seq: 3,
        };
        let desc = |seq, kind| OpDesc {
            seq,
            kind,
            dtype: None,
            count: 4,
            root: None,
            op: None,
        };
        assert!(!fault.matches(&desc(2, OpKind::AllGather)));
        assert!(!fault.matches(&desc(3, OpKind::ReduceScatter)));
        assert!(fault.matches(&desc(3, OpKind::AllGather)));
        assert!(fault.matches(&desc(9, OpKind::AllReduce)));
    }

    proptest! {
        #[test]
        fn a_hash_survives_its_f32_words(h in any::<u64>()) {
            prop_assert_eq!(words_to_hash(&hash_to_words(h)), h);
        }

        #[test]
        fn one_flipped_bit_changes_the_hash(v in prop::collection::vec(any::<f32>(), 1..64), i in any::<prop::sample::Index>(), bit in 0u32..32) {
            let i = i.index(v.len());
            let mut w = v.clone();
            w[i] = f32::from_bits(w[i].to_bits() ^ (1 << bit));
            prop_assert_ne!(hash_f32_bits(v), hash_f32_bits(w));
        }
    }
}
