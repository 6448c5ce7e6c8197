//! Megatron-style tensor parallelism of the blocks, on the CPU: T ranks of a split model
//! ([`Gpt::with_tensor_parallel`], or [`Gpt::with_vocab_parallel`] splitting the vocabulary
//! too) run in lockstep in one thread, the group's all-reduces done here by a naive sum of
//! the ranks' buffers (rank order, the sum written back to every rank), against the whole
//! model (T = 1) from the same parameters. The ranks' gradient slices are put back into
//! whole tensors by this file's own index arithmetic. The drivers that take the all-reduce
//! as a closure run with each rank on its own thread and must give the lockstep bits;
//! checkpointed split blocks must give the un-checkpointed bits.
//!
//! Legend: T the tensor-parallel size, B batch, S sequence, C channels, NH heads, L layers.

mod checkpointing;
mod common;
mod matches;
mod program;
mod refusals;
mod threads;
