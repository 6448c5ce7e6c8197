//! The GPT-2 model: configuration, parameter layout in units, and forward/backward kernels.
//!
//! Legend used in every file: B batch, T sequence, C channels, L layers, NH heads,
//! hs = C/NH, N = B*T, V vocabulary, Vp padded vocabulary, maxT = `max_seq_len`.
//!
//! Written in the spirit of llm.c: explicit forward and backward passes over flat buffers,
//! no autograd. Parameters live in UNITS (embeddings, one per block, final LayerNorm), each a
//! flat buffer that the caller owns; [`Gpt`] runs unit by unit so an engine can gather,
//! reduce and free each unit around its own call. The kernels sit behind the [`Backend`]
//! trait: `Gpt::new` runs them on the CPU ([`CpuBackend`]), `Gpt::with_backend` on another
//! backend (`cuda::CudaBackend` with the `cuda` feature, not yet run on a GPU).
//!
//! Tensor parallelism (Megatron-LM's): `Gpt::with_tensor_parallel` is one rank of a group
//! of T that splits every block's matrices by heads and MLP columns
//! ([`ParamLayout::split`]), `Gpt::with_vocab_parallel` (CPU) also the vocabulary of the
//! tied embedding and the loss ([`ParamLayout::split_vocab`]). The model owns no
//! communicator: between its split calls it hands out the buffer due for the group's
//! all-reduce ([`Gpt::tp_partial`]), so an engine can run the collectives as operations of
//! its own.
//!
//! ```
//! use zero_gpt::{init_params, Gpt, GptConfig};
//!
//! let model = Gpt::new(GptConfig::tiny())?;
//! let params = init_params(model.config(), model.layout(), 42);
//! let lens = model.layout().unit_lens();
//! let mut grads: Vec<Vec<f32>> = lens.iter().map(|&n| vec![0.0; n]).collect();
//! let mut acts = model.activations(2, 8)?;
//! let tokens: Vec<u32> = (0..16).collect();
//! let targets: Vec<u32> = (1..17).collect();
//! let loss = model.forward_backward(&mut acts, &params, &mut grads, &tokens, &targets)?;
//! assert!((loss - 100f32.ln()).abs() < 0.3); // about ln(V) at init
//! # Ok::<(), zero_gpt::GptError>(())
//! ```

#![warn(missing_docs)]

mod activations;
pub mod backend;
mod config;
pub mod cuda;
mod error;
mod init;
pub mod kernels;
mod layout;
mod model;
mod program;
mod sample;
mod split;
mod split_map;
mod tp_program;
mod views;

pub use activations::{
    activation_buffers, activation_bytes, ActivationMemory, Activations, Buffer, KeptBy,
    BACKEND_SCRATCH, BUFFER_NAMES, GRAD_VIEWS, HEAD_VIEWS, KEPT_INPUTS, LAYER_VIEWS,
};
pub use backend::{Backend, CpuBackend, View};
pub use config::{
    pad_vocab, GptConfig, GPT2_VOCAB_SIZE, MAX_LAYERS_OR_HEADS, PRESET_NAMES, VOCAB_PAD_MULTIPLE,
};
pub use error::{GptError, Result};
pub use init::{init_params, init_split_unit, init_unit, Rng, INIT_STD};
pub use layout::{decays, ParamLayout, TensorSpec, UnitKind, UnitLayout};
pub use model::Gpt;
pub use program::{checkpoint_segment, forward_ops, is_recomputed, train_ops, GptOp};
pub use sample::sample_top_k;
pub use split::{slice_part, TpSplit};
pub use split_map::{part_runs, unit_origin, Run};
pub use tp_program::{tp_train_ops, BlockPart, TpOp};
