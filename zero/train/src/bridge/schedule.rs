//! The engine calls of one GPT micro-step, declared for the memory plan: the sequence
//! `forward` and `backward` in the bridge make. The engine compares every call with this
//! declaration, so the two cannot drift apart silently.

use zero::{Schedule, UnitCall};
use zero_gpt::ParamLayout;

/// The schedule of the GPT laid out as `layout`, with activation checkpointing every
/// `checkpoint_every` blocks or none.
pub fn gpt_schedule(layout: &ParamLayout, checkpoint_every: Option<usize>) -> Schedule {
    use UnitCall::{BeginBackward as Begin, EndBackward as End, Gather, Release};
    let last = layout.final_norm_unit();
    let layers = last - 1;
    let block = ParamLayout::block_unit;
    let mut calls = vec![Gather(0), Release(0)];
    calls.extend((0..layers).flat_map(|l| [Gather(block(l)), Release(block(l))]));
    calls.extend([Gather(last), Gather(0)]);
    // The head: its input gradient, then the tied weight's part without parameters.
    calls.extend([
        Begin(last),
        End(last),
        Release(last),
        Release(0),
        Begin(0),
        End(0),
    ]);
    for layer in (0..layers).rev() {
        let segment = segment_of(layer, layers, checkpoint_every);
        let recomputed = checkpoint_every.is_some()
            && layer + 1 == segment.end
            && segment.start != segment_of(layers - 1, layers, checkpoint_every).start;
        if recomputed {
            // The segment's blocks forward again; the last stays gathered for its backward.
            for l in segment.clone() {
                calls.push(Gather(block(l)));
                if l != layer {
                    calls.push(Release(block(l)));
                }
            }
        } else {
            calls.push(Gather(block(layer)));
        }
        let unit = block(layer);
        calls.extend([Begin(unit), End(unit), Release(unit)]);
    }
    calls.extend([Begin(0), End(0)]);
    Schedule::new(calls)
}

/// The blocks of `layer`'s checkpointed segment (`Activations::segment`'s rule).
fn segment_of(layer: usize, layers: usize, every: Option<usize>) -> std::ops::Range<usize> {
    match every {
        None => layer..layer + 1,
        Some(k) => {
            let start = layer - layer % k;
            start..(start + k).min(layers)
        }
    }
}
