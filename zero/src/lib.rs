//! ZeRO: partitioned optimizer states, gradients and parameters, and the bundled GPT-2 trainer.
#![warn(missing_docs)]
