//! The GPT-2 model: configuration, parameter layout in units, and forward/backward kernels.
