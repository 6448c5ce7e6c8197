//! The cases. Each is generic over the backend (it only sees a `Communicator`) and runs every
//! dtype, every reduction, in place and out of place, at lengths 0, 1, non-multiples of the
//! group size and sizes that cross the reduction kernel's 2048-element blocks. Integer types
//! have no avg: every case checks that it is refused instead.

use half::{bf16, f16};
use zero_comm::{Collective, CommError, Communicator, OpKind, ReduceOp};

use super::data::{
    close, data, f64_rank_order, inputs, int_rank_order, rank_order, reference, rough, rough_f64,
    same_bits, wide_ints, Val, OPS,
};
use super::{Case, Result};

/// Every case, by name.
pub const CASES: &[(&str, Case)] = &[
    ("all_reduce", case_all_reduce),
    ("reduce_scatter", case_reduce_scatter),
    ("all_gather", case_all_gather),
    ("broadcast", case_broadcast),
    ("reduce", case_reduce),
    ("barrier", case_barrier),
    ("counts_by_kind", case_counts_by_kind),
    ("split_grid", case_split_grid),
    ("split_key_order", case_split_key_order),
    ("async_in_issue_order", case_async_in_issue_order),
    ("async_matches_blocking", case_async_matches_blocking),
    ("bitwise_rank_order", case_bitwise_rank_order),
    ("f64_rank_order_bits", case_f64_rank_order_bits),
    ("integer_sums_wrap", case_integer_sums_wrap),
    ("bad_arguments", case_bad_arguments),
];

macro_rules! each_dtype {
    ($f:ident ( $($arg:expr),* )) => {{
        each_f32_dtype!($f($($arg),*));
        $f::<i32>($($arg),*)?;
        $f::<i64>($($arg),*)?;
        $f::<f64>($($arg),*)?;
    }};
}

/// The types reduced in f32.
macro_rules! each_f32_dtype {
    ($f:ident ( $($arg:expr),* )) => {{
        $f::<f32>($($arg),*)?;
        $f::<bf16>($($arg),*)?;
        $f::<f16>($($arg),*)?;
    }};
}

/// True (after checking the call was refused) when `op` is avg on an integer type: the
/// refusal is an argument error on every rank, so the group stays in step.
fn refused_avg<T: Val>(op: ReduceOp, call: impl FnOnce() -> zero_comm::Result<()>) -> Result<bool> {
    if !(T::INTEGER && op == ReduceOp::Avg) {
        return Ok(false);
    }
    let e = call();
    ensure!(
        matches!(e, Err(CommError::UnsupportedReduction { redop: ReduceOp::Avg, dtype, .. }) if dtype == T::DTYPE),
        "avg on {:?}: want UnsupportedReduction, got {e:?}",
        T::DTYPE
    );
    Ok(true)
}

fn all_reduce_t<T: Val>(c: &Communicator) -> Result {
    let n = c.size();
    for (k, len) in [0, 1, 7, 3 * n + 1, 4099].into_iter().enumerate() {
        for op in OPS {
            if refused_avg::<T>(op, || {
                c.all_reduce_in_place(&mut vec![T::default(); len], op)
            })? {
                continue;
            }
            for in_place in [false, true] {
                let ins = inputs::<T>(k as u64, n, len);
                let mine = &ins[c.rank()];
                let got = if in_place {
                    let mut buf = mine.clone();
                    c.all_reduce_in_place(&mut buf, op)?;
                    buf
                } else {
                    let mut out = vec![T::default(); len];
                    c.all_reduce(mine, &mut out, op)?;
                    out
                };
                let what = format!("all_reduce {:?} len {len} in_place {in_place}", T::DTYPE);
                close(&got, &reference(&ins, op), op, &what)?;
            }
        }
    }
    Ok(())
}

/// All-reduce equals the reference on every rank.
pub fn case_all_reduce(c: &Communicator) -> Result {
    each_dtype!(all_reduce_t(c));
    Ok(())
}

fn reduce_scatter_t<T: Val>(c: &Communicator) -> Result {
    let (n, r) = (c.size(), c.rank());
    for (k, per) in [0, 1, 5, 2049].into_iter().enumerate() {
        for op in OPS {
            let mut buf = vec![T::default(); n * per];
            if refused_avg::<T>(op, || c.reduce_scatter_in_place(&mut buf, op))? {
                continue;
            }
            for in_place in [false, true] {
                let ins = inputs::<T>(10 + k as u64, n, n * per);
                let mine = &ins[r];
                let got = if in_place {
                    let mut buf = mine.clone();
                    c.reduce_scatter_in_place(&mut buf, op)?;
                    let (before, after) = (&buf[..r * per], &buf[(r + 1) * per..]);
                    ensure!(
                        before == &mine[..r * per] && after == &mine[(r + 1) * per..],
                        "in-place reduce_scatter touched other chunks"
                    );
                    buf[r * per..(r + 1) * per].to_vec()
                } else {
                    let mut out = vec![T::default(); per];
                    c.reduce_scatter(mine, &mut out, op)?;
                    out
                };
                let want = &reference(&ins, op)[r * per..(r + 1) * per];
                let what = format!(
                    "reduce_scatter {:?} per {per} in_place {in_place}",
                    T::DTYPE
                );
                close(&got, want, op, &what)?;
            }
        }
    }
    Ok(())
}

/// Rank r gets chunk r of the reduction; in place, the other chunks stay as they were.
pub fn case_reduce_scatter(c: &Communicator) -> Result {
    each_dtype!(reduce_scatter_t(c));
    Ok(())
}

fn all_gather_t<T: Val>(c: &Communicator) -> Result {
    let (n, r) = (c.size(), c.rank());
    for (k, per) in [0, 1, 5, 1000].into_iter().enumerate() {
        for in_place in [false, true] {
            let shards = inputs::<T>(20 + k as u64, n, per);
            let mut out = vec![T::default(); n * per];
            if in_place {
                out[r * per..(r + 1) * per].copy_from_slice(&shards[r]);
                c.all_gather_in_place(&mut out)?;
            } else {
                c.all_gather(&shards[r], &mut out)?;
            }
            ensure!(
                out == shards.concat(),
                "all_gather {:?} per {per} in_place {in_place}",
                T::DTYPE
            );
        }
    }
    Ok(())
}

/// Every rank gets the concatenation of the shards in rank order.
pub fn case_all_gather(c: &Communicator) -> Result {
    each_dtype!(all_gather_t(c));
    Ok(())
}

fn broadcast_t<T: Val>(c: &Communicator) -> Result {
    let n = c.size();
    for root in 0..n {
        for len in [0, 1, 33] {
            for in_place in [false, true] {
                let ins = inputs::<T>(30 + root as u64, n, len);
                let got = if in_place {
                    let mut buf = ins[c.rank()].clone();
                    c.broadcast_in_place(&mut buf, root)?;
                    buf
                } else {
                    let mut out = vec![T::default(); len];
                    c.broadcast(&ins[c.rank()], &mut out, root)?;
                    out
                };
                ensure!(
                    got == ins[root],
                    "broadcast {:?} root {root} len {len} in_place {in_place}",
                    T::DTYPE
                );
            }
        }
    }
    Ok(())
}

/// Every rank gets the root's array, from every root.
pub fn case_broadcast(c: &Communicator) -> Result {
    each_dtype!(broadcast_t(c));
    Ok(())
}

fn reduce_t<T: Val>(c: &Communicator) -> Result {
    let (n, r) = (c.size(), c.rank());
    for root in 0..n {
        for len in [0, 1, 2 * n + 1, 2500] {
            for op in OPS {
                let mut buf = vec![T::default(); len];
                if refused_avg::<T>(op, || c.reduce_in_place(&mut buf, op, root))? {
                    continue;
                }
                for in_place in [false, true] {
                    let ins = inputs::<T>(40 + len as u64, n, len);
                    let mine = &ins[r];
                    let got = if in_place {
                        let mut buf = mine.clone();
                        c.reduce_in_place(&mut buf, op, root)?;
                        ensure!(
                            r == root || &buf == mine,
                            "in-place reduce changed a non-root input"
                        );
                        buf
                    } else {
                        // Non-roots may pass an empty receive buffer.
                        let mut out = vec![T::default(); if r == root { len } else { 0 }];
                        c.reduce(mine, &mut out, op, root)?;
                        out
                    };
                    if r == root {
                        let what = format!("reduce {:?} root {root} len {len}", T::DTYPE);
                        close(&got, &reference(&ins, op), op, &what)?;
                    }
                }
            }
        }
    }
    Ok(())
}

/// The root gets the reduction, from every root; non-root buffers are left alone.
pub fn case_reduce(c: &Communicator) -> Result {
    each_dtype!(reduce_t(c));
    Ok(())
}

/// Barriers complete and count as operations.
pub fn case_barrier(c: &Communicator) -> Result {
    let before = c.stats();
    for _ in 0..5 {
        c.barrier()?;
    }
    let after = c.stats();
    ensure!(
        after.ops == before.ops + 5,
        "5 barriers counted as {} ops",
        after.ops - before.ops
    );
    Ok(())
}

/// Each kind of collective is counted under its own kind, and the counts add up to `ops`.
pub fn case_counts_by_kind(c: &Communicator) -> Result {
    let before = c.stats();
    let n = c.size();
    let mut x = vec![1.0f32; 2 * n];
    for _ in 0..3 {
        c.all_reduce_in_place(&mut x, ReduceOp::Sum)?;
    }
    let mut whole = vec![0.0f32; 2 * n];
    c.all_gather(&x[..2], &mut whole)?;
    c.all_gather(&x[..2], &mut whole)?;
    let mut part = vec![0.0f32; 2];
    c.reduce_scatter(&x, &mut part, ReduceOp::Sum)?;
    c.barrier()?;
    let after = c.stats();
    let delta = |k: OpKind| after.ops_of(k) - before.ops_of(k);
    let want = [
        (OpKind::AllReduce, 3),
        (OpKind::AllGather, 2),
        (OpKind::ReduceScatter, 1),
        (OpKind::Barrier, 1),
        (OpKind::Broadcast, 0),
        (OpKind::Reduce, 0),
    ];
    for (kind, count) in want {
        ensure!(
            delta(kind) == count,
            "{kind}: counted {}, issued {count}",
            delta(kind)
        );
    }
    let by_kind: u64 = after.ops_by_kind.iter().sum();
    ensure!(by_kind == after.ops, "by kind {by_kind}, ops {}", after.ops);
    Ok(())
}

/// A dp x tp grid: `split(r / tp, r % tp)` gives tensor-parallel rows, `split(r % tp, r / tp)`
/// data-parallel columns; each sub-group reduces only its members, and the parent still works.
pub fn case_split_grid(c: &Communicator) -> Result {
    let (n, r) = (c.size(), c.rank());
    let tp = if n % 2 == 0 { 2 } else { 1 };
    let dp = n / tp;
    let row = c.split((r / tp) as u32, (r % tp) as u32)?;
    let col = c.split((r % tp) as u32, (r / tp) as u32)?;
    let mut x = vec![r as f32; 3];
    row.all_reduce_in_place(&mut x, ReduceOp::Sum)?;
    let mut y = vec![r as f32; 3];
    col.all_reduce_in_place(&mut y, ReduceOp::Sum)?;
    let mut z = vec![1.0f32];
    c.all_reduce_in_place(&mut z, ReduceOp::Sum)?;
    ensure!(
        (row.size(), row.rank()) == (tp, r % tp),
        "row group: size {} rank {}",
        row.size(),
        row.rank()
    );
    ensure!(
        (col.size(), col.rank()) == (dp, r / tp),
        "column group: size {} rank {}",
        col.size(),
        col.rank()
    );
    let row_sum: usize = (0..tp).map(|j| r / tp * tp + j).sum();
    let col_sum: usize = (0..dp).map(|i| r % tp + i * tp).sum();
    ensure!(
        x == vec![row_sum as f32; 3],
        "row sum {x:?}, want {row_sum}"
    );
    ensure!(
        y == vec![col_sum as f32; 3],
        "column sum {y:?}, want {col_sum}"
    );
    ensure!(z == vec![n as f32], "parent after split: {z:?}");
    Ok(())
}

/// Keys order ranks within a color (reversed keys reverse ranks); colors separate groups.
pub fn case_split_key_order(c: &Communicator) -> Result {
    let (n, r) = (c.size(), c.rank());
    let reversed = c.split(0, (100 - r) as u32)?;
    let parity = c.split((r % 2) as u32, r as u32)?;
    let mut members = vec![0f32; parity.size()];
    parity.all_gather(&[r as f32], &mut members)?;
    ensure!(
        reversed.rank() == n - 1 - r,
        "reversed keys: rank {} -> {}",
        r,
        reversed.rank()
    );
    let want: Vec<f32> = (0..n)
        .filter(|j| j % 2 == r % 2)
        .map(|j| j as f32)
        .collect();
    ensure!(
        members == want,
        "parity group members {members:?}, want {want:?}"
    );
    Ok(())
}

/// Many non-blocking operations in flight complete in issue order; a blocking call after
/// them waits for them.
pub fn case_async_in_issue_order(c: &Communicator) -> Result {
    let (n, r) = (c.size(), c.rank());
    let works: Vec<_> = (0..16)
        .map(|i| c.all_reduce_async(vec![(r + i) as f32; 1000], ReduceOp::Sum))
        .collect();
    c.barrier()?;
    let all_done = works.iter().all(|w| w.is_done());
    let mut got = Vec::new();
    for w in works {
        got.push(w.wait()?[999]);
    }
    ensure!(
        all_done,
        "a blocking barrier returned before earlier async ops"
    );
    let want: Vec<f32> = (0..16).map(|i| (n * (n - 1) / 2 + n * i) as f32).collect();
    ensure!(got == want, "async results {got:?}, want {want:?}");
    Ok(())
}

/// Each non-blocking form gives what its blocking form gives, and returns the buffers.
pub fn case_async_matches_blocking(c: &Communicator) -> Result {
    let (n, r) = (c.size(), c.rank());
    let base: Vec<f32> = data(50, r, 2 * n);
    let rs = c.reduce_scatter_async(base.clone(), ReduceOp::Max);
    let ag = c.all_gather_async({
        let mut v = vec![0f32; 2 * n];
        v[2 * r..2 * r + 2].fill(r as f32);
        v
    });
    let bc = c.broadcast_async(vec![r as f32; 2], n - 1);
    let rd = c.reduce_async(vec![1f32; 2], ReduceOp::Sum, 0);
    let oop = c.collective_async(
        Collective::AllReduce(ReduceOp::Min),
        Some(base.clone()),
        vec![0f32; 2 * n],
    );
    let bar = c.barrier_async();
    let rs = rs.wait()?;
    let ag = ag.wait()?;
    let bc = bc.wait()?;
    let rd = rd.wait()?;
    let (send, recv) = oop.wait()?;
    bar.wait()?;
    let ins: Vec<Vec<f32>> = (0..n).map(|j| data(50, j, 2 * n)).collect();
    let max = reference(&ins, ReduceOp::Max);
    ensure!(
        rs[2 * r..2 * r + 2] == max[2 * r..2 * r + 2],
        "reduce_scatter_async"
    );
    let want_ag: Vec<f32> = (0..n).flat_map(|j| [j as f32; 2]).collect();
    ensure!(ag == want_ag, "all_gather_async {ag:?}");
    ensure!(bc == vec![(n - 1) as f32; 2], "broadcast_async {bc:?}");
    ensure!(r != 0 || rd == vec![n as f32; 2], "reduce_async {rd:?}");
    ensure!(
        send.as_deref() == Some(&base[..]),
        "collective_async lost its send buffer"
    );
    ensure!(
        recv == reference(&ins, ReduceOp::Min),
        "collective_async all_reduce min"
    );
    Ok(())
}

fn bitwise_t<T: Val>(c: &Communicator) -> Result {
    let (n, r) = (c.size(), c.rank());
    let len = 4 * n * 257;
    let ins: Vec<Vec<T>> = (0..n).map(|j| rough(60, j, len)).collect();
    for op in OPS {
        let want = rank_order(&ins, op);
        let mut ar = ins[r].clone();
        c.all_reduce_in_place(&mut ar, op)?;
        let mut rs = vec![T::default(); len / n];
        c.reduce_scatter(&ins[r], &mut rs, op)?;
        let mut rd = vec![T::default(); len];
        c.reduce(&ins[r], &mut rd, op, n - 1)?;
        let what = |k: &str| format!("{k} {:?} {op} vs rank-order f32 loop", T::DTYPE);
        same_bits(&ar, &want, &what("all_reduce"))?;
        let chunk = r * (len / n)..(r + 1) * (len / n);
        same_bits(&rs, &want[chunk], &what("reduce_scatter"))?;
        if r == n - 1 {
            same_bits(&rd, &want, &what("reduce"))?;
        }
    }
    Ok(())
}

/// The documented arithmetic to the bit: every element accumulated in f32 over ranks 0..N-1
/// in order, avg divided by N in f32, one final rounding (values whose sums round, so the
/// reduction order shows), for every dtype and reduction.
pub fn case_bitwise_rank_order(c: &Communicator) -> Result {
    each_f32_dtype!(bitwise_t(c));
    Ok(())
}

/// f64 to the bit: every element combined in f64 over ranks 0..N-1 in order, avg divided by
/// N, on values whose sums round (so the reduction order shows), checked against a plain
/// loop.
pub fn case_f64_rank_order_bits(c: &Communicator) -> Result {
    let (n, r) = (c.size(), c.rank());
    let len = 4 * n * 257;
    let ins: Vec<Vec<f64>> = (0..n).map(|j| rough_f64(70, j, len)).collect();
    for op in OPS {
        let want = f64_rank_order(&ins, op);
        let mut ar = ins[r].clone();
        c.all_reduce_in_place(&mut ar, op)?;
        let mut rs = vec![0f64; len / n];
        c.reduce_scatter(&ins[r], &mut rs, op)?;
        let mut rd = vec![0f64; len];
        c.reduce(&ins[r], &mut rd, op, n - 1)?;
        let what = |k: &str| format!("{k} f64 {op} vs rank-order f64 loop");
        same_bits(&ar, &want, &what("all_reduce"))?;
        let chunk = r * (len / n)..(r + 1) * (len / n);
        same_bits(&rs, &want[chunk], &what("reduce_scatter"))?;
        if r == n - 1 {
            same_bits(&rd, &want, &what("reduce"))?;
        }
    }
    Ok(())
}

/// Runs all-reduce, reduce-scatter and reduce (root 0) of `ins` and checks each against
/// `want`, the rank-order loop's result.
fn int_collectives<T: Val>(c: &Communicator, ins: &[Vec<T>], want: &[T], what: &str) -> Result {
    let (n, r) = (c.size(), c.rank());
    let len = want.len();
    let mut ar = vec![T::default(); len];
    c.all_reduce(&ins[r], &mut ar, ReduceOp::Sum)?;
    let mut rs = ins[r].clone();
    c.reduce_scatter_in_place(&mut rs, ReduceOp::Sum)?;
    let mut rd = ins[r].clone();
    c.reduce_in_place(&mut rd, ReduceOp::Sum, 0)?;
    let chunk = r * (len / n)..(r + 1) * (len / n);
    same_bits(&ar, want, &format!("all_reduce {what}"))?;
    same_bits(
        &rs[chunk.clone()],
        &want[chunk],
        &format!("reduce_scatter {what}"),
    )?;
    if r == 0 {
        same_bits(&rd, want, &format!("reduce {what}"))?;
    }
    Ok(())
}

/// Integer sums are exact and wrap at the type's limits (two's complement, as NCCL and MPI
/// sum integers); max and min are exact; checked against Rust's `wrapping_add` in rank order.
pub fn case_integer_sums_wrap(c: &Communicator) -> Result {
    let n = c.size();
    let len = 2 * n * 1031; // crosses the kernel's 2048-element blocks
    let wide: Vec<Vec<u64>> = (0..n).map(|j| wide_ints(80, j, len)).collect();
    let ins64: Vec<Vec<i64>> = wide
        .iter()
        .map(|v| v.iter().map(|&x| x as i64).collect())
        .collect();
    let ins32: Vec<Vec<i32>> = wide
        .iter()
        .map(|v| v.iter().map(|&x| (x >> 32) as i32).collect())
        .collect();
    let sum64 = int_rank_order(&ins64, ReduceOp::Sum, i64::wrapping_add);
    let sum32 = int_rank_order(&ins32, ReduceOp::Sum, i32::wrapping_add);
    ensure!(
        n == 1
            || sum64
                .iter()
                .zip(&ins64[0])
                .any(|(s, x)| s.checked_sub(*x).is_none()),
        "the data should make some i64 sums wrap"
    );
    int_collectives(c, &ins64, &sum64, "i64 sum")?;
    int_collectives(c, &ins32, &sum32, "i32 sum")?;
    for op in [ReduceOp::Max, ReduceOp::Min] {
        let want = int_rank_order(&ins64, op, i64::wrapping_add);
        let mut got = ins64[c.rank()].clone();
        c.all_reduce_in_place(&mut got, op)?;
        same_bits(&got, &want, &format!("all_reduce i64 {op}"))?;
    }
    // The limits themselves: MAX + 1 wraps to MIN, MIN + MIN to 0.
    let (r, last) = (c.rank(), n - 1);
    let mut x = [
        if r == 0 {
            i64::MAX
        } else if r == last {
            1
        } else {
            0
        },
        i64::MIN,
    ];
    c.all_reduce_in_place(&mut x, ReduceOp::Sum)?;
    let want_min_sum = if n % 2 == 0 { 0 } else { i64::MIN };
    let want = [if n == 1 { i64::MAX } else { i64::MIN }, want_min_sum];
    ensure!(x == want, "i64 limits: got {x:?}, want {want:?}");
    Ok(())
}

/// Wrong lengths and roots are errors on the calling rank, before any communication.
pub fn case_bad_arguments(c: &Communicator) -> Result {
    let n = c.size();
    let mut out = vec![0f32; 3];
    let e = c.all_reduce(&[1.0; 4], &mut out, ReduceOp::Sum);
    ensure!(matches!(e, Err(CommError::Length { .. })), "length: {e:?}");
    let e = c.broadcast_in_place(&mut out, n);
    ensure!(matches!(e, Err(CommError::Root { .. })), "root: {e:?}");
    let mut odd = vec![0f32; n + 1];
    let e = c.reduce_scatter_in_place(&mut odd, ReduceOp::Sum);
    ensure!(
        n == 1 || matches!(e, Err(CommError::Length { .. })),
        "non-multiple: {e:?}"
    );
    // The group still works.
    c.barrier()?;
    Ok(())
}
