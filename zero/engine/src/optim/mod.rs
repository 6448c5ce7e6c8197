//! Optimizers: AdamW over shards of flat buffers, the learning-rate schedule, and global
//! gradient-norm clipping from per-shard partial sums.
//!
//! Everything here works on plain slices so that the ZeRO engine can apply it to whichever
//! shard `[offset, offset + len)` of a unit a rank owns; applying the update shard by shard
//! gives bit-for-bit the same result as applying it to the whole buffer.
//!
//! ```
//! use zero::optim::{AdamW, DecaySegment};
//!
//! let opt = AdamW::default();
//! let (mut p, g) = (vec![1.0f32; 4], vec![0.5f32; 4]);
//! let (mut m, mut v) = (vec![0.0f32; 4], vec![0.0f32; 4]);
//! let segments = [DecaySegment { range: 0..2, decay: true }, DecaySegment { range: 2..4, decay: false }];
//! opt.update(&mut p, &g, &mut m, &mut v, 0, &segments, 1, 1e-3)?;
//! assert!(p[0] < p[2], "decayed weights shrink more");
//! # Ok::<(), zero::Error>(())
//! ```

mod adamw;
mod clip;
mod schedule;

pub use adamw::{AdamW, DecaySegment, StepConstants};
pub use clip::{clip_coefficient, global_norm, sum_of_squares};
pub use schedule::CosineSchedule;
