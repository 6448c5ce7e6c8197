//! Optimizers: AdamW and the learning-rate schedule.
