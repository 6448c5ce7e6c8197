//! How the bridge hands the engine's arena blocks to a model backend's kernels: host slices
//! for [`CpuBackend`], device views for `CudaBackend` (feature `cuda`). The bridge's passes
//! are written once over [`Placement`].

use std::borrow::Cow;

use zero::{Engine, OpUnits};
use zero_gpt::{Activations, Backend, Buffer, CpuBackend, Gpt, GptError};

/// Parameters (shared) and gradients (mutable) of some units in a backend's view type.
pub type Views<'e, S> = (Vec<&'e S>, Vec<&'e mut S>);

/// A model backend whose views the engine's blocks can be given as.
pub trait Placement: Backend + Sized {
    /// `unit`'s whole f32 parameters, read by the running operation ([`OpUnits::params`]).
    ///
    /// # Errors
    /// As [`OpUnits::params`].
    fn params<'u>(units: &'u OpUnits<'_>, unit: usize) -> Result<&'u Self::Slice, zero::Error>;

    /// The parameters the running operation reads and the gradients it writes
    /// ([`OpUnits::views`]).
    ///
    /// # Errors
    /// As [`OpUnits::views`].
    fn views<'u>(units: &'u mut OpUnits<'_>) -> Result<Views<'u, Self::Slice>, zero::Error>;

    /// Where the running operation writes the kept input it declared ([`OpUnits::kept_mut`]).
    ///
    /// # Errors
    /// As [`OpUnits::kept_mut`].
    fn kept_mut<'u>(units: &'u mut OpUnits<'_>) -> Result<&'u mut Self::Slice, zero::Error>;

    /// The kept input the running operation restores ([`OpUnits::restored`]).
    ///
    /// # Errors
    /// As [`OpUnits::restored`].
    fn restored<'u>(units: &'u OpUnits<'_>) -> Result<&'u Self::Slice, zero::Error>;

    /// A block of `len` floats lent for good from the engine's arena, as a model buffer.
    ///
    /// # Errors
    /// As [`Engine::lend_f32`].
    fn lend(engine: &mut Engine, len: usize) -> Result<Buffer<Self::Slice>, zero::Error>;

    /// `view`'s values on the host (logits for sampling), after the kernels that wrote them.
    ///
    /// # Errors
    /// A failed copy, or an earlier failed kernel launch.
    fn to_host<'v>(&self, view: &'v Self::Slice) -> Result<Cow<'v, [f32]>, GptError>;

    /// Waits for every kernel launched so far (the engine's update included: they share the
    /// stream) and returns the first launch error since the last wait, so a step's time is
    /// its own and a failed launch in the last step's backward is not lost.
    ///
    /// # Errors
    /// An earlier failed kernel launch, or a failed wait.
    fn finish_step(&self) -> Result<(), GptError>;

    /// The memory this backend's arenas draw from, for the start-up check when no
    /// `--memory-limit` is given: what it is, and its bytes; `None` where it cannot be told.
    fn memory_budget(&self) -> Option<(&'static str, u64)>;

    /// Sums `partial` over the tensor-parallel group the engine was told
    /// ([`OpUnits::tensor_parallel`]), in place, in rank order: the all-reduce of a split
    /// model's partial output or input gradient.
    ///
    /// By default (CUDA among them) the backend runs no tensor parallelism and refuses; the
    /// trainer refuses `--tensor-parallel-size` above 1 on a GPU at start-up.
    ///
    /// # Errors
    /// No tensor-parallel group; collective failures; a backend that cannot.
    fn tp_all_reduce(_units: &OpUnits<'_>, _partial: &mut Self::Slice) -> Result<(), zero::Error> {
        Err(zero::Error::Order(
            "tensor parallelism runs on the CPU only (--tensor-parallel-size 1 elsewhere)".into(),
        ))
    }

    /// `model` and `acts` as the CPU backend's, where this is the CPU backend, for the
    /// calls zero-gpt runs on the CPU only (the vocabulary split); `None` elsewhere.
    fn on_cpu<'a>(
        _model: &'a Gpt<Self>,
        _acts: &'a mut Activations<Self>,
    ) -> Option<(&'a Gpt, &'a mut Activations)> {
        None
    }
}

impl Placement for CpuBackend {
    fn params<'u>(units: &'u OpUnits<'_>, unit: usize) -> Result<&'u [f32], zero::Error> {
        units.params(unit)
    }

    fn views<'u>(units: &'u mut OpUnits<'_>) -> Result<Views<'u, [f32]>, zero::Error> {
        units.views()
    }

    fn kept_mut<'u>(units: &'u mut OpUnits<'_>) -> Result<&'u mut [f32], zero::Error> {
        units.kept_mut()
    }

    fn restored<'u>(units: &'u OpUnits<'_>) -> Result<&'u [f32], zero::Error> {
        units.restored()
    }

    fn lend(engine: &mut Engine, len: usize) -> Result<Buffer, zero::Error> {
        if len == 0 {
            return Ok(Box::new(Vec::<f32>::new()));
        }
        Ok(Box::new(engine.lend_f32(len)?))
    }

    fn to_host<'v>(&self, view: &'v [f32]) -> Result<Cow<'v, [f32]>, GptError> {
        Ok(Cow::Borrowed(view))
    }

    fn finish_step(&self) -> Result<(), GptError> {
        Ok(())
    }

    fn memory_budget(&self) -> Option<(&'static str, u64)> {
        let available = zero_alloc::host_available_bytes()?;
        Some((zero_alloc::host_memory_description(), available))
    }

    fn tp_all_reduce(units: &OpUnits<'_>, partial: &mut [f32]) -> Result<(), zero::Error> {
        let tp = units.tensor_parallel().ok_or_else(|| {
            zero::Error::Order(
                "a split model's sum over its tensor-parallel group is due, and the engine \
                 was told no group (Engine::with_tensor_parallel)"
                    .into(),
            )
        })?;
        Ok(tp.all_reduce_in_place(partial, zero_comm::ReduceOp::Sum)?)
    }

    fn on_cpu<'a>(
        model: &'a Gpt,
        acts: &'a mut Activations,
    ) -> Option<(&'a Gpt, &'a mut Activations)> {
        Some((model, acts))
    }
}

#[cfg(feature = "cuda")]
mod cuda {
    //! Device views of a CUDA arena's blocks: the engine lends them as zero-alloc views
    //! (`OpUnits::device_param`, `OpUnits::device_views`) or loans, and zero-gpt turns those
    //! into `DeviceSlice`s (`DeviceSlice::from_view`, `from_lent`), where the soundness
    //! argument lives.
    use super::{Placement, Views};
    use std::borrow::Cow;
    use zero::{Engine, OpUnits};
    use zero_alloc::LentDevice;
    use zero_gpt::cuda::{CudaBackend, DeviceSlice};
    use zero_gpt::GptError;
    use zero_gpt::{ActivationMemory, Buffer};

    impl Placement for CudaBackend {
        fn params<'u>(units: &'u OpUnits<'_>, unit: usize) -> Result<&'u DeviceSlice, zero::Error> {
            Ok(DeviceSlice::from_view(units.device_param(unit)?))
        }

        fn views<'u>(units: &'u mut OpUnits<'_>) -> Result<Views<'u, DeviceSlice>, zero::Error> {
            let (params, grads) = units.device_views()?;
            Ok((
                params.into_iter().map(DeviceSlice::from_view).collect(),
                grads.into_iter().map(DeviceSlice::from_view_mut).collect(),
            ))
        }

        fn kept_mut<'u>(units: &'u mut OpUnits<'_>) -> Result<&'u mut DeviceSlice, zero::Error> {
            Ok(DeviceSlice::from_view_mut(units.device_kept_mut()?))
        }

        fn restored<'u>(units: &'u OpUnits<'_>) -> Result<&'u DeviceSlice, zero::Error> {
            Ok(DeviceSlice::from_view(units.device_restored()?))
        }

        fn lend(engine: &mut Engine, len: usize) -> Result<Buffer<DeviceSlice>, zero::Error> {
            Ok(Box::new(LentBlock {
                lent: (len > 0).then(|| engine.lend_device_f32(len)).transpose()?,
            }))
        }

        fn to_host<'v>(&self, view: &'v DeviceSlice) -> Result<Cow<'v, [f32]>, GptError> {
            Ok(Cow::Owned(CudaBackend::to_host(self, view)?))
        }

        fn finish_step(&self) -> Result<(), GptError> {
            self.synchronize()
        }

        fn memory_budget(&self) -> Option<(&'static str, u64)> {
            // The whole GPU: the context, cuBLAS and NVRTC's modules also take some, so
            // this catches plans that cannot fit at all, not the last few hundred MB.
            let total = self.stream().context().total_mem().ok()?;
            Some(("the GPU's total memory", total as u64))
        }
    }

    /// A device block lent from the engine's arena for good, as a model buffer.
    #[derive(Debug)]
    struct LentBlock {
        lent: Option<LentDevice>,
    }

    impl ActivationMemory<DeviceSlice> for LentBlock {
        fn floats(&self) -> &DeviceSlice {
            match &self.lent {
                Some(l) => DeviceSlice::from_lent(l),
                // A buffer of no floats borrows nothing: no null address is made.
                None => DeviceSlice::empty(),
            }
        }

        fn floats_mut(&mut self) -> &mut DeviceSlice {
            match &mut self.lent {
                Some(l) => DeviceSlice::from_lent_mut(l),
                None => DeviceSlice::empty(),
            }
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn a_lent_buffer_of_no_floats_views_a_non_null_address() {
            // No GPU needed: an empty buffer lends nothing and its views are not read.
            let mut empty = LentBlock { lent: None };
            assert_eq!(empty.floats().len(), 0);
            assert_ne!(empty.floats().addr(), 0);
            assert_ne!(empty.floats_mut().addr(), 0);
        }
    }
}
