//! Checkpoints: llm.c's float32 model format and the trainer's own resumable state.
