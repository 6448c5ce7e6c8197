//! ZeRO-Infinity's parameter offload ([`EngineConfig::offload_params`](crate::EngineConfig)):
//! at stage 3, the stored shard of every unit the stage gathers lives off the rank's arena,
//! in a host arena of its own (`--offload-params cpu`) or in the rank's parameter file
//! (`--offload-params nvme`, `param_file`). Units kept whole (under the persistence
//! threshold) stay in the arena.
//!
//! The shard's handle is then a block of [`OffloadedParams::arena`]: the host arena, or for
//! the file an accounting arena (no memory) mirroring the file's shards, so the sizes are
//! measured as in any other home. The data flow of an offloaded unit:
//! 1. a gather (the stage-3 prefetch, or the gather of a unit not prefetched) copies the
//!    shard from its home straight into this rank's chunk of the all-gather's buffer in the
//!    engine's arena ([`Engine::fetch_shard`]), and all-gathers in place: the arena holds
//!    no copy of the shard besides the gathered unit. From the host arena the copy is a
//!    memory copy on the engine's thread; from the file, the shard is taken from its read
//!    ahead when it has one (`param_read_ahead`: an I/O thread reads the shards of the
//!    running program's next gathers into a host arena of their own, within
//!    [`EngineConfig::nvme_prefetch_bytes`]), or sent by the fetch itself when it has none
//!    (and waited for), and each fetch tops the reads ahead up; both copies go through the
//!    arena's `write_at`, so the rank's arena may be a GPU's;
//! 2. the offloaded update (`optimizer_home`) reads the shard's pieces from the home
//!    (fp32, where they are Adam's master copy) and writes the updated pieces back there;
//!    a write first drops any read ahead of the same unit;
//! 3. checkpoints read and write the shard through [`OffloadedParams::read`] /
//!    [`OffloadedParams::write`].
//!
//! A prefetched unit's fetch happens one unit ahead of its use (`prefetch_units`); the
//! file's reads ahead run further ahead, as far as the budget allows.

use super::declared::Declared;
use super::engine::{Engine, EngineConfig};
use super::error::{Error, Result};
use super::host_io::{stored_bytes, stored_values};
use super::param_file::ParamFile;
use super::param_read_ahead::ReadAhead;
use super::planning::offload_plan::{piece_elems, OffloadPlan, ParamFileLayout};
use super::planning::plan::{arena_config, host_backing, read_ahead_arena_config};
use super::planning::policy::{UnitPolicy, ZeroStage};
use super::trace::Lane;
use std::ops::Range;
use std::path::Path;
use zero_alloc::{Arena, ArenaConfig, Device, Handle};

/// The offloaded parameter shards' home: a host arena, or the file and its accounting
/// mirror.
#[derive(Debug)]
pub(crate) struct OffloadedParams {
    /// The shards (cpu tier), or the file's accounting mirror (nvme tier).
    pub arena: Arena,
    /// The rank's parameter file (`--offload-params nvme`).
    pub file: Option<ParamFile>,
    /// The file's reads ahead of the gathers (with the file, unless no unit is gathered).
    pub ahead: Option<ReadAhead>,
}

impl OffloadedParams {
    /// The home `plan` asks for: a host arena of `plan.params` bytes; with
    /// `config.params_file`, the rank's file under `nvme_path`, an accounting arena of its
    /// bytes, and the reads ahead's host arena. Host arenas are registered with the GPU's
    /// context when the rank's arena is a GPU's (`states_on`), so copies to it go by DMA.
    pub fn start(
        plan: &OffloadPlan,
        config: &EngineConfig,
        states_on: Device,
        nvme_path: Option<&Path>,
        policies: &[UnitPolicy],
        ranks: (usize, usize),
    ) -> Result<Self> {
        let backing = host_backing(states_on);
        if !config.params_file {
            let capacity = usize::try_from(plan.params).unwrap_or(usize::MAX);
            let config = ArenaConfig {
                backing,
                ..arena_config(capacity, false)
            };
            return Ok(Self {
                arena: Arena::new(config)?,
                file: None,
                ahead: None,
            });
        }
        let dir = nvme_path.ok_or_else(|| {
            Error::Config(
                "the parameters' file tier (--offload-params nvme) needs a directory \
                 (--nvme-path)"
                    .into(),
            )
        })?;
        let elem = config.precision.param_bytes() as usize;
        let piece = piece_elems(config.reduce_bucket_bytes, config.precision);
        let layout = ParamFileLayout::new(policies, elem, piece);
        let file = ParamFile::create(dir, ranks, layout, config.nvme_chunk_bytes)?;
        let ahead = match usize::try_from(plan.params_read_ahead).unwrap_or(usize::MAX) {
            0 => None,
            bytes => {
                let arena = Arena::new(ArenaConfig {
                    backing,
                    ..read_ahead_arena_config(bytes)
                })?;
                let (tier, layout) = file.shared();
                let budget = (arena, config.nvme_prefetch_bytes);
                Some(ReadAhead::start(
                    tier,
                    layout,
                    config.nvme_chunk_bytes,
                    budget,
                )?)
            }
        };
        let mirror = usize::try_from(plan.params_file).unwrap_or(usize::MAX);
        Ok(Self {
            arena: Arena::accounting(mirror)?,
            file: Some(file),
            ahead,
        })
    }

    /// Fills `out` from byte `at` of `unit`'s shard (block `h` of the home) on.
    pub fn read(&mut self, unit: usize, h: Handle, at: usize, out: &mut [u8]) -> Result<()> {
        match &mut self.file {
            Some(file) => file.read(unit, at, out),
            None => Ok(self.arena.read_at(h, at, out)?),
        }
    }

    /// Writes `data` into `unit`'s shard (block `h` of the home) from byte `at` on, after
    /// dropping any read ahead of it.
    pub fn write(&mut self, unit: usize, h: Handle, at: usize, data: &[u8]) -> Result<()> {
        if let Some(ahead) = &mut self.ahead {
            ahead.forget(unit)?;
        }
        match &mut self.file {
            Some(file) => file.write(unit, at, data),
            None => Ok(self.arena.write_at(h, at, data)?),
        }
    }

    /// Copies `unit`'s shard (block `h`, `len` bytes) into block `dst` of `to` from byte
    /// `at` on, with `to`'s `write_at` (host or device memory alike): from the host arena
    /// straight, from the file through its read ahead, sent now if it has none; true when
    /// this fetch sent the file's read (the gather waited for the whole read; a read sent
    /// earlier may have been waited for in part, which the trace's read span shows).
    fn copy_into(
        &mut self,
        (unit, h, len): (usize, Handle, usize),
        to: &mut Arena,
        (dst, at): (Handle, usize),
    ) -> Result<bool> {
        if self.file.is_none() {
            let src = self.arena.slice::<u8>(h)?;
            let src = src.get(..len).ok_or_else(|| short(unit, len))?;
            to.write_at(dst, at, src)?;
            return Ok(false);
        }
        let ahead = self.ahead.as_mut().ok_or_else(|| {
            Error::Order(format!(
                "unit {unit} is fetched from a file planned with no reads"
            ))
        })?;
        let waited = !ahead.has(unit);
        if waited {
            ahead.read_now(unit, len)?;
        }
        let put = |src: &[u8]| Ok(to.write_at(dst, at, src)?);
        match ahead.take(unit, len, put)? {
            true => Ok(waited),
            false => Err(Error::Order(format!("unit {unit}'s read was not sent"))),
        }
    }
}

/// Moves the spans of the reads ahead answered so far into the trace being recorded, if
/// any (they are dropped otherwise).
fn move_spans(ahead: &mut ReadAhead, trace: Option<&mut crate::Trace>) {
    let spans = std::mem::take(&mut ahead.spans);
    if let Some(trace) = trace {
        trace.spans.extend(spans);
    }
}

fn short(unit: usize, len: usize) -> Error {
    Error::BadSpan {
        kernel: "parameter fetch",
        message: format!("unit {unit}'s shard or its destination is shorter than {len} bytes"),
    }
}

/// Refuses `offload_params` where it cannot run: below stage 3 nothing is gathered, and
/// without `offload_optimizer` the update would have to bring every shard back into the
/// arena (the offloaded update reads and writes them where they live).
pub(crate) fn check_param_offload(config: &EngineConfig) -> Result<()> {
    if !config.offload_params {
        return Ok(());
    }
    if config.stage != ZeroStage::Zero3 {
        return Err(Error::Config(format!(
            "parameter offload (--offload-params) needs stage 3, where parameters are \
             partitioned and gathered; this run is at {}",
            config.stage
        )));
    }
    if !config.offload_optimizer {
        return Err(Error::Config(
            "parameter offload (--offload-params) needs the optimizer offloaded too \
             (--offload-optimizer cpu or nvme): the update runs where the shards live"
                .into(),
        ));
    }
    Ok(())
}

impl Engine {
    /// Bytes of the offloaded parameter shards, measured from their home's blocks (the
    /// file tier's mirror for the file); 0 without parameter offload.
    ///
    /// # Errors
    /// Arena failures (a stale handle would be a bug).
    pub fn offloaded_param_bytes(&self) -> Result<u64> {
        let Some(home) = &self.offloaded_params else {
            return Ok(0);
        };
        let mut bytes = 0u64;
        for (unit, b) in self.units.bufs.iter().enumerate() {
            if self.params_offloaded(unit) {
                bytes += home.arena.block(b.params)?.size as u64;
            }
        }
        Ok(bytes)
    }

    /// Elements `range` of `unit`'s stored parameters (the block the stage keeps), widened to
    /// f32, wherever they live.
    pub(crate) fn read_stored(&mut self, unit: usize, range: Range<usize>) -> Result<Vec<f32>> {
        let precision = self.config.precision;
        let elem = precision.param_bytes() as usize;
        let mut bytes = vec![0u8; range.len() * elem];
        let h = self.units.bufs[unit].params;
        match self
            .offloaded_params
            .as_mut()
            .filter(|_| self.units.policies[unit].gathered())
        {
            Some(home) => home.read(unit, h, range.start * elem, &mut bytes)?,
            None => self.arena.read_at(h, range.start * elem, &mut bytes)?,
        }
        Ok(stored_values(precision, &bytes))
    }

    /// Rounds `values` to the storage type and writes them into `unit`'s stored parameters
    /// from element `at` on, wherever they live.
    pub(crate) fn write_stored_params(
        &mut self,
        unit: usize,
        at: usize,
        values: &[f32],
    ) -> Result<()> {
        let precision = self.config.precision;
        let elem = precision.param_bytes() as usize;
        let bytes = stored_bytes(precision, values);
        let h = self.units.bufs[unit].params;
        match self
            .offloaded_params
            .as_mut()
            .filter(|_| self.units.policies[unit].gathered())
        {
            Some(home) => home.write(unit, h, at * elem, &bytes),
            None => Ok(self.arena.write_at(h, at * elem, &bytes)?),
        }
    }

    /// `unit`'s stored shard lives off the arena (`offload_params`, a unit stage 3 gathers).
    pub(crate) fn params_offloaded(&self, unit: usize) -> bool {
        self.offloaded_params.is_some() && self.units.policies[unit].gathered()
    }

    /// Step 1 of the module's data flow: copies `unit`'s stored shard from its home into
    /// block `dst` of the engine's arena from element `at` (of `elem` bytes) on; from the
    /// file, out of its read ahead when it has one, and the reads ahead topped up after.
    pub(crate) fn fetch_shard(
        &mut self,
        unit: usize,
        dst: Handle,
        at: usize,
        elem: usize,
    ) -> Result<()> {
        self.read_ahead(None)?;
        let start = std::time::Instant::now();
        let len = self.units.policies[unit].len(false) * elem;
        let h = self.units.bufs[unit].params;
        let home = self
            .offloaded_params
            .as_mut()
            .ok_or_else(|| Error::Order("a parameter fetch without offloaded parameters".into()))?;
        let waited = home.copy_into((unit, h, len), &mut self.arena, (dst, at * elem))?;
        // A gather that sent its own file read is the file's lane; a copy from memory (the
        // host tier, or a read ahead), the copy lane's.
        let lane = if waited { Lane::File } else { Lane::Copy };
        self.trace_span(lane, start, || format!("fetch params unit {unit}"));
        self.read_ahead(Some(unit))
    }

    /// Step 1 of `param_read_ahead`: asks for reads of the shards of the running program's
    /// gathers from the current call on that will fetch
    /// ([`Declared::fetches_ahead`](crate::declared::Declared::fetches_ahead):
    /// `skip`, being fetched, and the units gathered or in flight are held until their
    /// release), in order; moves the spans of the reads answered into the trace. Nothing
    /// without the file's read-ahead.
    fn read_ahead(&mut self, skip: Option<usize>) -> Result<()> {
        self.issue_reads(skip, Declared::fetches_ahead, usize::MAX)
    }

    /// Step 1 between programs, as the update writes the shards in unit order: once unit
    /// `written`'s update has run, asks for the reads of the first fetches of the program
    /// that ran last ([`Declared::fetches_of_next_run`](crate::declared::Declared)), in
    /// order, up to the first unit not updated yet, so the next run's first gathers find
    /// their shards read during the update. A program that does not gather them drops
    /// them at its end (step 5).
    pub(crate) fn read_ahead_after_update(&mut self, written: usize) -> Result<()> {
        self.issue_reads(None, Declared::fetches_of_next_run, written)
    }

    /// Sends the reads of the units `walk` lists (given which units are held), in order,
    /// stopping at the first past `upto` or the first the budget holds back.
    fn issue_reads(
        &mut self,
        skip: Option<usize>,
        walk: fn(&Declared, Vec<bool>) -> Vec<usize>,
        upto: usize,
    ) -> Result<()> {
        let Some(ahead) = self
            .offloaded_params
            .as_mut()
            .and_then(|h| h.ahead.as_mut())
        else {
            return Ok(());
        };
        move_spans(ahead, self.trace.as_mut());
        let elem = self.config.precision.param_bytes() as usize;
        let held = (self.units.bufs.iter().enumerate())
            .map(|(u, b)| {
                b.gathered.is_some() || self.flights.prefetched[u].is_some() || Some(u) == skip
            })
            .collect();
        for unit in walk(&self.declared, held)
            .into_iter()
            .take_while(|&u| u <= upto)
        {
            let policy = self.units.policies[unit];
            if policy.gathered() && !ahead.issue(unit, policy.len(false) * elem)? {
                break;
            }
        }
        Ok(())
    }

    /// Step 5 of `param_read_ahead`, at the end of a program: drops the reads ahead not
    /// used and moves their spans into the trace.
    pub(crate) fn drop_reads_ahead(&mut self) -> Result<()> {
        let Some(ahead) = self
            .offloaded_params
            .as_mut()
            .and_then(|h| h.ahead.as_mut())
        else {
            return Ok(());
        };
        let dropped = ahead.forget_all();
        move_spans(ahead, self.trace.as_mut());
        dropped
    }

    /// The host arena of the parameter file's reads ahead (`None` without the parameter
    /// file): its statistics and peak.
    pub fn params_read_ahead_arena(&self) -> Option<&Arena> {
        let home = self.offloaded_params.as_ref()?;
        home.ahead.as_ref().map(ReadAhead::arena)
    }

    /// The host arena of the offloaded parameters (`None` unless they are offloaded to
    /// the host; the file tier's mirror holds no memory): its statistics and peak.
    pub fn offload_params_arena(&self) -> Option<&Arena> {
        let home = self.offloaded_params.as_ref()?;
        home.file.is_none().then_some(&home.arena)
    }

    /// The parameter file's path and (bytes, bytes read, bytes written) since start-up
    /// (`None` unless the parameters are in a file).
    pub fn params_file(&self) -> Option<(&Path, ParamFileStats)> {
        let home = self.offloaded_params.as_ref()?;
        let file = home.file.as_ref()?;
        let ahead_seconds = home.ahead.as_ref().map_or(0.0, |a| a.read_seconds);
        Some((
            file.path(),
            ParamFileStats {
                file_bytes: file.file_bytes(),
                pool_bytes: file.pool_bytes() + home.ahead.as_ref().map_or(0, |a| a.pool_bytes),
                read_bytes: file.read_bytes + home.ahead.as_ref().map_or(0, |a| a.read_bytes),
                written_bytes: file.written_bytes,
                direct: file.is_direct(),
                io_seconds: (file.io_seconds.0 + ahead_seconds, file.io_seconds.1),
                pooled_bytes: file.pooled_bytes(),
            },
        ))
    }
}

/// What the parameter file holds and has moved, for tests and reports.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ParamFileStats {
    /// Bytes of the file (header and every piece's slot).
    pub file_bytes: u64,
    /// Bytes of its pool buffers (the engine thread's and the read-ahead thread's), fixed
    /// at start-up.
    pub pool_bytes: u64,
    /// Bytes read from the file since start-up, on either thread.
    pub read_bytes: u64,
    /// Bytes written to it since start-up (the zeroed file's creation not counted).
    pub written_bytes: u64,
    /// The file bypasses the page cache (`O_DIRECT`).
    pub direct: bool,
    /// Seconds spent in the file's reads (on either thread) and writes since start-up.
    pub io_seconds: (f64, f64),
    /// Bytes of those reads and writes copied through a pool buffer rather than moved
    /// straight (`zero_alloc::tier::TierFile::pooled_bytes`).
    pub pooled_bytes: u64,
}
