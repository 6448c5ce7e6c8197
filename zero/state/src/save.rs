//! Saving an engine's states as a sharded state (format and crash-safety protocol in
//! `sharded.rs`), in the foreground or in the background.
//!
//! A save has two halves. [`start_save`]: world rank 0 creates the partial folder and the ranks
//! agree it exists; then each rank writes its pieces, either at once straight from the
//! engine's buffers (no copy), or, in the background, from a snapshot of its owned shards
//! taken into an ordinary `Vec` (12 bytes per owned element) so that training can go on
//! changing the engine. [`finish_save`]: waits for the writing, has the ranks agree that all
//! succeeded, and has world rank 0 publish. Every collective runs on the training thread: the
//! background thread only writes files, so it never interleaves with training's collectives.
//! (A pinned buffer was rejected for the snapshot: the states are already in host memory,
//! and nothing copies them to a device.)

use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use zero::{Engine, Precision, StateKind};
use zero_comm::ReduceOp;

use crate::error::{Result, StateError};
use crate::sharded::{partial_dir, step_dir, Partitioning, UnitPartition};
use crate::sharded_write::{begin_save, publish, PieceWriter};

/// The name a manifest gives a precision.
pub(crate) fn precision_name(p: Precision) -> &'static str {
    match p {
        Precision::Fp32 => "fp32",
        Precision::Bf16 => "bf16",
        Precision::Fp16 => "fp16",
    }
}

/// This rank's tensor-parallel rank and T (0 and 1 without a tensor-parallel group).
fn tp_place(engine: &Engine) -> (usize, usize) {
    engine
        .tensor_parallel()
        .map_or((0, 1), |tp| (tp.rank(), tp.size()))
}

/// This rank in the whole world: `dp_rank * T + tp_rank` (zero's tensor-parallel grid).
fn world_rank(engine: &Engine) -> usize {
    let (tp_rank, t) = tp_place(engine);
    engine.rank() * t + tp_rank
}

/// Whether this rank writes `unit`: every unit at tensor-parallel rank 0; above it only the
/// units split across the group, as the replicated ones are the same on every rank.
fn writes_unit(engine: &Engine, unit: usize) -> bool {
    tp_place(engine).0 == 0 || engine.units()[unit].tp_sharded
}

/// `engine`'s split of every unit across its ranks.
fn partitioning(engine: &Engine) -> Result<Partitioning> {
    let units = (0..engine.units().len())
        .map(|unit| {
            let part = engine.partition(unit)?;
            let owned = (0..part.world())
                .map(|r| {
                    let s = part.data_shard(r);
                    [s.offset as u64, s.end() as u64]
                })
                .collect();
            Ok(UnitPartition {
                numel: part.numel() as u64,
                padded_numel: part.padded_numel() as u64,
                shard_len: part.shard_len() as u64,
                owned,
            })
        })
        .collect::<Result<Vec<_>, zero::Error>>()?;
    Ok(Partitioning {
        world: engine.world(),
        tensor_parallel: tp_place(engine).1,
        stage: engine.config().stage as u8,
        precision: precision_name(engine.config().precision).into(),
        units,
    })
}

/// Makes `local` every rank's outcome: `Ok` only when every rank of the world succeeded
/// (the maximum over the data-parallel group, then over the tensor-parallel group, is the
/// world's). Collective.
fn agree<T>(engine: &Engine, dir: &Path, local: Result<T>) -> Result<T> {
    let mut failed = [if local.is_err() { 1.0f32 } else { 0.0 }];
    engine
        .comm()
        .all_reduce_in_place(&mut failed, ReduceOp::Max)?;
    if let Some(tp) = engine.tensor_parallel() {
        tp.all_reduce_in_place(&mut failed, ReduceOp::Max)?;
    }
    match local {
        Err(e) => Err(e),
        Ok(_) if failed[0] > 0.0 => Err(StateError::PeerFailed {
            path: dir.to_path_buf(),
        }),
        Ok(v) => Ok(v),
    }
}

/// This rank's pieces straight from the engine: the owned elements of every unit it
/// writes, parameters then m then v. Returns the bytes written.
fn write_pieces(engine: &mut Engine, partial: &Path) -> Result<u64> {
    let rank = engine.rank();
    let mut needed = 0u64;
    for unit in (0..engine.units().len()).filter(|&u| writes_unit(engine, u)) {
        let owned = engine.partition(unit)?.data_shard(rank).len as u64;
        needed = needed.saturating_add(owned.saturating_mul(12));
    }
    let room = Room::check(partial, needed)?;
    write_owned(engine, partial).map_err(|e| room.explain(e))
}

/// The disk room a rank's pieces need, and what the disk had free before they were written.
struct Room {
    needed: u64,
    free: Option<u64>,
}

impl Room {
    /// Refuses pieces of `needed` bytes on a disk with fewer free under `partial`.
    fn check(partial: &Path, needed: u64) -> Result<Self> {
        let free = zero_alloc::tier::available_bytes(partial);
        match free {
            Some(f) if f < needed => Err(StateError::DiskFull {
                path: partial.to_path_buf(),
                needed,
                free,
            }),
            _ => Ok(Self { needed, free }),
        }
    }

    /// `err`, or when the disk filled up during the write, [`StateError::DiskFull`].
    fn explain(&self, err: StateError) -> StateError {
        match &err {
            StateError::Io(io) if io.source.kind() == std::io::ErrorKind::StorageFull => {
                StateError::DiskFull {
                    path: io.path.clone(),
                    needed: self.needed,
                    free: self.free,
                }
            }
            _ => err,
        }
    }
}

/// [`write_pieces`]'s writes.
fn write_owned(engine: &mut Engine, partial: &Path) -> Result<u64> {
    let mut w = PieceWriter::create(partial, world_rank(engine), tp_place(engine).0)?;
    let mut bytes = 0u64;
    for unit in 0..engine.units().len() {
        if !writes_unit(engine, unit) {
            continue;
        }
        let o = engine.owned_states(unit)?;
        w.write(unit, StateKind::Params.name(), o.range.start, &o.params)?;
        w.write(unit, StateKind::AdamM.name(), o.range.start, &o.m)?;
        w.write(unit, StateKind::AdamV.name(), o.range.start, &o.v)?;
        bytes += 3 * 4 * o.range.len() as u64;
    }
    w.finish()?;
    Ok(bytes)
}

/// A copy of one unit's owned states: the unit, its first element, then params, m, v.
type UnitSnapshot = (usize, usize, [Vec<f32>; 3]);

/// Copies this rank's owned states of every unit it writes.
fn snapshot(engine: &mut Engine) -> Result<Vec<UnitSnapshot>> {
    let units: Vec<usize> = (0..engine.units().len())
        .filter(|&unit| writes_unit(engine, unit))
        .collect();
    units
        .into_iter()
        .map(|unit| {
            let o = engine.owned_states(unit)?;
            Ok((unit, o.range.start, [o.params, o.m, o.v]))
        })
        .collect()
}

/// Writes a snapshot as the pieces of world rank `rank`, tensor-parallel rank `tp_rank`;
/// returns the bytes written.
fn write_snapshot(
    partial: &Path,
    (rank, tp_rank): (usize, usize),
    units: &[UnitSnapshot],
) -> Result<u64> {
    let needed = units
        .iter()
        .flat_map(|(_, _, states)| states.iter().map(|v| 4 * v.len() as u64))
        .sum();
    let room = Room::check(partial, needed)?;
    let written = (|| {
        let mut w = PieceWriter::create(partial, rank, tp_rank)?;
        let mut bytes = 0u64;
        for (unit, start, states) in units {
            for (kind, values) in StateKind::ALL.iter().zip(states) {
                w.write(*unit, kind.name(), *start, values)?;
                bytes += 4 * values.len() as u64;
            }
        }
        w.finish()?;
        Ok(bytes)
    })();
    written.map_err(|e| room.explain(e))
}

/// How this rank's pieces are being written.
#[derive(Debug)]
enum Writing {
    /// Written already, with this outcome.
    Done(Result<u64>),
    /// Being written by a thread.
    Background(JoinHandle<Result<u64>>),
}

/// A save whose pieces are written (or being written) and not yet published.
#[derive(Debug)]
#[must_use = "a save is published only by finish_save"]
pub struct PendingSave {
    save: PathBuf,
    step: u64,
    meta: serde_json::Value,
    keep_last: usize,
    writing: Writing,
}

impl PendingSave {
    /// The step being saved.
    pub fn step(&self) -> u64 {
        self.step
    }
}

/// Starts saving `engine`'s states after `step` steps as `save/step-N/` with `meta` in its
/// manifest (every rank of the world, its tensor-parallel group included): world rank 0
/// creates the partial folder, then this rank writes its pieces, at once, or on a
/// background thread from a snapshot when `background`. Collective.
///
/// # Errors
/// Creating the folder (every rank fails then). Write errors surface in [`finish_save`].
pub fn start_save(
    engine: &mut Engine,
    save: &Path,
    step: u64,
    meta: serde_json::Value,
    keep_last: usize,
    background: bool,
) -> Result<PendingSave> {
    let dir = step_dir(save, step);
    let began = if world_rank(engine) == 0 {
        begin_save(save, step).map(|_| ())
    } else {
        Ok(())
    };
    agree(engine, &dir, began).inspect_err(|_| discard_partial(engine, save, step))?;
    let partial = partial_dir(save, step);
    let writing = if background {
        let units = snapshot(engine)?;
        let ranks = (world_rank(engine), tp_place(engine).0);
        Writing::Background(std::thread::spawn(move || {
            write_snapshot(&partial, ranks, &units)
        }))
    } else {
        Writing::Done(write_pieces(engine, &partial))
    };
    Ok(PendingSave {
        save: save.to_path_buf(),
        step,
        meta,
        keep_last,
        writing,
    })
}

/// Waits for `pending`'s pieces, has the ranks agree that all were written, and has world rank 0
/// publish the state and point `latest` at it. Collective. Returns the folder and the bytes
/// this rank wrote.
///
/// # Errors
/// This rank's write or publish error (a background error surfaces here, naming the file);
/// on the other ranks, that a peer failed. Nothing is published then.
pub fn finish_save(engine: &mut Engine, pending: PendingSave) -> Result<(PathBuf, u64)> {
    let dir = step_dir(&pending.save, pending.step);
    let written = match pending.writing {
        Writing::Done(result) => result,
        Writing::Background(handle) => match handle.join() {
            Ok(result) => result,
            Err(_) => Err(StateError::BadState {
                path: partial_dir(&pending.save, pending.step),
                reason: "the background writer of this rank's pieces panicked".into(),
            }),
        },
    };
    let discard = |engine: &Engine| discard_partial(engine, &pending.save, pending.step);
    let bytes = agree(engine, &dir, written).inspect_err(|_| discard(engine))?;
    let published = if world_rank(engine) == 0 {
        partitioning(engine).and_then(|layout| {
            publish(
                &pending.save,
                pending.step,
                layout,
                pending.meta,
                pending.keep_last,
            )
            .map(|_| ())
        })
    } else {
        Ok(())
    };
    agree(engine, &dir, published).inspect_err(|_| discard(engine))?;
    Ok((dir, bytes))
}

/// After a save failed on some rank (every rank knows by then, and none is still writing):
/// world rank 0 removes the partial folder, so a full disk is not kept full by a state that will
/// never be published. A removal that fails is only a warning: the save's own error is the
/// one to report.
fn discard_partial(engine: &Engine, save: &Path, step: u64) {
    let partial = partial_dir(save, step);
    if world_rank(engine) != 0 || !partial.exists() {
        return;
    }
    if let Err(e) = std::fs::remove_dir_all(&partial) {
        tracing::warn!(
            "could not remove the failed save's {}: {e}",
            partial.display()
        );
    }
}

/// Saves in the foreground: [`start_save`] then [`finish_save`]. Collective.
///
/// # Errors
/// As those two.
pub fn save_sharded(
    engine: &mut Engine,
    save: &Path,
    step: u64,
    meta: serde_json::Value,
    keep_last: usize,
) -> Result<(PathBuf, u64)> {
    let pending = start_save(engine, save, step, meta, keep_last, false)?;
    finish_save(engine, pending)
}
