//! Memory the model owns inside the engine's arena: blocks lent out for good (its
//! activations), within the bytes declared in
//! [`EngineConfig::activation_bytes`](crate::EngineConfig::activation_bytes), so the arena
//! counts and caps them with the model states.

use super::engine::Engine;
use super::error::{Error, Result};
use super::planning::plan::arena_config;
use super::transient::free_on_error;
use zero_alloc::{Handle, Lent};

impl Engine {
    /// A block of `len` f32 elements from this rank's arena, lent out for good (pinned, so
    /// compaction never moves it): memory the model owns, such as its activations, that the
    /// arena counts and caps with the model states. Its bytes must be declared in
    /// [`EngineConfig::activation_bytes`](crate::EngineConfig::activation_bytes), which the
    /// plan reserves.
    ///
    /// # Errors
    /// [`Error::Undeclared`] past the declared bytes; arena errors.
    pub fn lend_f32(&mut self, len: usize) -> Result<Lent<f32>> {
        let h = self.declared_block(len)?;
        let lent = self.arena.lend::<f32>(h).map_err(Error::from);
        free_on_error(&mut self.arena, h, lent)
    }

    /// As [`Engine::lend_f32`] on a CUDA arena: the block's device address, lent for good.
    ///
    /// # Errors
    /// As [`Engine::lend_f32`]; a host arena.
    #[cfg(feature = "cuda")]
    pub fn lend_device_f32(&mut self, len: usize) -> Result<zero_alloc::LentDevice> {
        let h = self.declared_block(len)?;
        let lent = self.arena.lend_device(h).map_err(Error::from);
        free_on_error(&mut self.arena, h, lent)
    }

    /// A block of `len` f32 elements within the declared activation bytes, counted there.
    fn declared_block(&mut self, len: usize) -> Result<Handle> {
        let bytes = len
            .checked_mul(4)
            .and_then(|b| arena_config(0, true).block_size(b))
            .map_or(u64::MAX, |b| b as u64);
        let lent = self.lent_bytes.saturating_add(bytes);
        if lent > self.config.activation_bytes {
            return Err(Error::Undeclared {
                lent,
                declared: self.config.activation_bytes,
            });
        }
        let h = self.arena.alloc_elems::<f32>(len)?;
        self.lent_bytes = lent;
        Ok(h)
    }
}
