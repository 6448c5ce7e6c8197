//! Saving the run: sharded states at `--save-every` (optionally in the background) and the
//! closing llm.c export.

use super::Trainer;
use crate::bridge::Placement;
use crate::checkpoint::resume::start_state_save;
use crate::checkpoint::tp_units::{parts_of, place};
use crate::checkpoint::{LlmcStreamWriter, ModelShape};
use crate::error::TrainError;
use std::time::Instant;
use zero_gpt::{ParamLayout, TpSplit};
use zero_state::{finish_save, PendingSave};

impl<'a, B: Placement> Trainer<'a, B> {
    /// Saves the run after `step` steps into the `--save` directory: every rank writes the
    /// states it owns, rank 0 publishes the manifest once all succeeded (collective). With
    /// `--async-save` the pieces of every save but the last are written in the background
    /// and published by the next save, which first waits for them.
    ///
    /// # Errors
    /// Engine, collective or checkpoint I/O errors, including those of the previous
    /// background save.
    pub(crate) fn save(&mut self, step: u64) -> Result<(), TrainError> {
        let cfg = self.shared.cfg;
        let Some(dir) = &cfg.save else {
            return Ok(());
        };
        if let Some((pending, began)) = self.pending_save.take() {
            self.publish(pending, began)?;
        }
        let began = Instant::now();
        let background = cfg.async_save && step < cfg.steps;
        let loader = self.loader.state();
        let (engine, model) = (&mut self.engine, &self.shared.model);
        let pending = start_state_save(engine, dir, cfg, model, &loader, step, background)?;
        if background {
            self.pending_save = Some((pending, began));
            Ok(())
        } else {
            self.publish(pending, began)
        }
    }

    /// Finishes a save and reports it.
    fn publish(&mut self, pending: PendingSave, began: Instant) -> Result<(), TrainError> {
        let (at, bytes) = finish_save(&mut self.engine, pending)?;
        if self.rank == 0 {
            self.shared.reporter.line(&format!(
                "saved {} ({bytes} bytes by rank 0, {:.0} ms from start to publication)",
                at.display(),
                began.elapsed().as_secs_f64() * 1e3
            ));
        }
        Ok(())
    }

    /// Writes `--export-llmc` (rank 0) unit by unit and waits for it; nothing without the
    /// flag. Each unit is gathered into the arena, written and freed, so the export holds one
    /// unit beyond the rank's states (at T > 1, one whole unit and the group's slices of it). A write failure on rank 0 is reported after every rank
    /// has finished the gathers, so no peer is left waiting in one.
    ///
    /// # Errors
    /// Engine, collective or checkpoint I/O errors.
    pub(crate) fn export_llmc(&mut self) -> Result<(), TrainError> {
        let Some(path) = &self.shared.cfg.export_llmc else {
            return Ok(());
        };
        let shape = ModelShape::from_config(&self.shared.model);
        let mut failure: Option<TrainError> = None;
        let mut writer = match (self.rank == 0).then(|| LlmcStreamWriter::create(path, shape)) {
            Some(Ok(w)) => Some(w),
            Some(Err(e)) => {
                failure = Some(e.into());
                None
            }
            None => None,
        };
        for unit in 0..ParamLayout::new(&self.shared.model).num_units() {
            let wrote = self.with_whole_unit(unit, |values| {
                writer.as_mut().map(|w| w.write_unit(unit, values))
            })?;
            if let Some(Err(e)) = wrote {
                failure.get_or_insert(e.into());
                writer = None;
            }
        }
        if let Some(Err(e)) = writer.map(LlmcStreamWriter::finish) {
            failure.get_or_insert(e.into());
        }
        self.engine.comm().barrier()?;
        failure.map_or(Ok(()), Err)
    }

    /// Calls `f` with whole-model unit `whole` (T = 1 numbering): the engine's unit as
    /// gathered over the data-parallel group at T = 1; at T > 1 assembled from the
    /// tensor-parallel group's slices (all-gathered) and this rank's other units.
    /// Collective over both groups.
    fn with_whole_unit<R>(
        &mut self,
        whole: usize,
        f: impl FnOnce(&[f32]) -> R,
    ) -> Result<R, TrainError> {
        let Some((t, rank)) = (self.engine.tensor_parallel()).map(|tp| (tp.size(), tp.rank()))
        else {
            return Ok(self.engine.with_whole_params(whole, f)?);
        };
        let model = self.shared.model;
        let mut out = vec![0f32; ParamLayout::new(&model).units()[whole].len];
        for (unit, slice) in parts_of(&model, t, whole)? {
            let mine = self.engine.with_whole_params(unit, <[f32]>::to_vec)?;
            match (slice, self.engine.tensor_parallel()) {
                (true, Some(tp)) => {
                    let mut all = vec![0f32; mine.len() * t];
                    tp.all_gather(&mine, &mut all)?;
                    for (r, values) in all.chunks_exact(mine.len().max(1)).enumerate() {
                        place(&model, TpSplit { size: t, rank: r }, unit, values, &mut out)?;
                    }
                }
                _ => place(&model, TpSplit { size: t, rank }, unit, &mine, &mut out)?,
            }
        }
        Ok(f(&out))
    }
}
