//! Descriptor agreement (`Config::debug_checks`): every rank all-gathers its `OpDesc` before
//! the collective, so a mismatch becomes the same error on every rank instead of a hang or a
//! truncated message. It costs one small all-gather per call, hence opt-in.

use crate::dtype::DType;
use crate::op::{OpDesc, OpKind};
use crate::reduce_op::ReduceOp;

const KINDS: [OpKind; 7] = OpKind::ALL;
const DTYPES: [DType; DType::ALL.len()] = DType::ALL;
const OPS: [ReduceOp; 4] = ReduceOp::ALL;
const NONE: u64 = u64::MAX;

/// Words per encoded descriptor.
pub(crate) const WORDS: usize = 6;

fn index<T: PartialEq>(table: &[T], v: Option<T>) -> u64 {
    v.and_then(|v| table.iter().position(|t| *t == v))
        .map_or(NONE, |i| i as u64)
}

fn lookup<T: Copy>(table: &[T], i: u64) -> Option<T> {
    usize::try_from(i).ok().and_then(|i| table.get(i).copied())
}

/// The wire form of a descriptor.
pub(crate) fn encode(d: &OpDesc) -> [u64; WORDS] {
    [
        d.seq,
        index(&KINDS, Some(d.kind)),
        index(&DTYPES, d.dtype),
        d.count as u64,
        d.root.map_or(NONE, |r| r as u64),
        index(&OPS, d.op),
    ]
}

/// Back from the wire form; a word that decodes to nothing (a corrupt peer) yields a
/// descriptor that differs from any real one in that field.
pub(crate) fn decode(w: &[u64]) -> OpDesc {
    let word = |i: usize| w.get(i).copied().unwrap_or(NONE);
    OpDesc {
        seq: word(0),
        kind: lookup(&KINDS, word(1)).unwrap_or(OpKind::Barrier),
        dtype: lookup(&DTYPES, word(2)),
        count: usize::try_from(word(3)).unwrap_or(usize::MAX),
        root: (word(4) != NONE).then(|| usize::try_from(word(4)).unwrap_or(usize::MAX)),
        op: lookup(&OPS, word(5)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_round_trip() {
        for kind in KINDS {
            for dtype in [None, Some(DType::Bf16), Some(DType::I64), Some(DType::F64)] {
                for (root, op) in [(None, None), (Some(3), Some(ReduceOp::Min))] {
                    let d = OpDesc {
                        seq: 42,
                        kind,
                        dtype,
                        count: 1 << 33,
                        root,
                        op,
                    };
                    assert_eq!(decode(&encode(&d)), d);
                }
            }
        }
    }
}
