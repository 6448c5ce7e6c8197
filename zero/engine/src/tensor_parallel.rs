//! Tensor (model) parallelism beside ZeRO, as Megatron-LM composes them: a 2-D grid of ranks
//! in which each tensor-parallel group splits the layers' tensors and each data-parallel
//! group runs ZeRO over one slice, and the conjugate operators that a model's program runs
//! as operations of its own.
//!
//! The grid orders ranks `r = dp_index * T + tp_rank`: the ranks of a tensor-parallel group
//! are adjacent (the fast links of one node, where the per-layer all-reduces go). An engine
//! runs on the data-parallel group ([`Grid::dp`]) and is told the tensor-parallel one
//! ([`Engine::with_tensor_parallel`]), over which it sums the gradient norm's squares of
//! the units that are slices ([`UnitSpec::tp_sharded`](crate::UnitSpec)) and agrees on
//! fp16 overflow.
//!
//! The conjugate operators, each a pair of passes ([`copy_to_tp`], [`reduce_from_tp`]):
//! - `f`, before a column-parallel layer: forward the identity (every rank reads the whole
//!   input), backward an all-reduce sum (each rank holds the input's gradient from its
//!   columns only);
//! - `g`, after a row-parallel layer: forward an all-reduce sum (each rank holds a partial
//!   product over its rows), backward the identity.

use super::engine::Engine;
use super::error::{Error, Result};
use zero_comm::{Communicator, ReduceOp};

/// A `dp x tp` grid of ranks and the two groups each rank belongs to.
#[derive(Debug)]
pub struct Grid {
    /// This rank's tensor-parallel group (ranks `dp_index * T ..(dp_index + 1) * T`).
    pub tp: Communicator,
    /// This rank's data-parallel group (ranks `tp_rank, tp_rank + T, ...`).
    pub dp: Communicator,
}

impl Grid {
    /// Splits `world` into groups of `tp_size` adjacent ranks and the data-parallel groups
    /// across them. Every rank of `world` must call it.
    ///
    /// # Errors
    /// A `tp_size` of 0 or one that does not divide the world size (before any collective,
    /// so every rank refuses alike); collective failures.
    pub fn new(world: &Communicator, tp_size: usize) -> Result<Self> {
        let size = world.size();
        if tp_size == 0 || size % tp_size != 0 {
            return Err(Error::Order(format!(
                "a tensor-parallel size of {tp_size} does not divide the {size} ranks"
            )));
        }
        let (rank, t) = (world.rank(), tp_size);
        let index = |x: usize| u32::try_from(x).map_err(|_| Error::Order("rank overflow".into()));
        let tp = world.split(index(rank / t)?, index(rank % t)?)?;
        let dp = world.split(index(rank % t)?, index(rank / t)?)?;
        Ok(Self { tp, dp })
    }
}

/// Megatron's `f`, before a column-parallel layer.
pub mod copy_to_tp {
    use super::{Communicator, ReduceOp, Result};

    /// Forward: the identity (each rank already holds the whole input).
    pub fn forward(_tp: &Communicator, _x: &mut [f32]) -> Result<()> {
        Ok(())
    }

    /// Backward: sums the input's gradient over the tensor-parallel group, in rank order.
    ///
    /// # Errors
    /// Collective failures.
    pub fn backward(tp: &Communicator, grad: &mut [f32]) -> Result<()> {
        Ok(tp.all_reduce_in_place(grad, ReduceOp::Sum)?)
    }
}

/// Megatron's `g`, after a row-parallel layer.
pub mod reduce_from_tp {
    use super::{Communicator, ReduceOp, Result};

    /// Forward: sums the partial outputs over the tensor-parallel group, in rank order.
    ///
    /// # Errors
    /// Collective failures.
    pub fn forward(tp: &Communicator, x: &mut [f32]) -> Result<()> {
        Ok(tp.all_reduce_in_place(x, ReduceOp::Sum)?)
    }

    /// Backward: the identity (every rank holds the whole output's gradient).
    pub fn backward(_tp: &Communicator, _grad: &mut [f32]) -> Result<()> {
        Ok(())
    }
}

impl Engine {
    /// This engine (on a data-parallel group, [`Grid::dp`]) beside the tensor-parallel group
    /// `tp` ([`Grid::tp`]): the gradient norm sums the squares of the units marked
    /// [`tp_sharded`](crate::UnitSpec::tp_sharded) over `tp` and counts the others once, and
    /// fp16's overflow check agrees over both groups, so every rank of the grid clips and
    /// skips alike.
    #[must_use]
    pub fn with_tensor_parallel(mut self, tp: Communicator) -> Self {
        self.tp = Some(tp);
        self
    }
}
