//! The model's calls on [`KeptInputs`] through a whole micro-step: recorded by a stand-in that
//! keeps the inputs in its own vectors, checked against the order written out by hand, and
//! the stand-in's results checked equal to the bit to the default buffer's.

use super::{Activations, KeptInputs};
use crate::error::Result;
use crate::{init_params, Gpt, GptConfig};
use std::sync::{Arc, Mutex};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Call {
    Keep(usize),
    Restore(usize),
    DueNext(usize),
}

/// Kept inputs in one `Vec` per segment, every call recorded in `calls` (shared with the test).
#[derive(Debug)]
struct Recording {
    inputs: Vec<Vec<f32>>,
    calls: Arc<Mutex<Vec<Call>>>,
}

impl KeptInputs for Recording {
    fn shape(&self) -> (usize, usize) {
        (self.inputs.len(), self.inputs.first().map_or(0, Vec::len))
    }
    fn keep(&mut self, segment: usize, input: &[f32]) -> Result<()> {
        self.calls.lock().unwrap().push(Call::Keep(segment));
        self.inputs[segment].copy_from_slice(input);
        Ok(())
    }
    fn restore(&mut self, segment: usize, input: &mut [f32]) -> Result<()> {
        self.calls.lock().unwrap().push(Call::Restore(segment));
        input.copy_from_slice(&self.inputs[segment]);
        Ok(())
    }
    fn due_next(&mut self, segment: usize) -> Result<()> {
        self.calls.lock().unwrap().push(Call::DueNext(segment));
        Ok(())
    }
    fn resident_bytes(&self) -> u64 {
        0
    }
    fn offloaded_bytes(&self) -> u64 {
        4 * self.inputs.iter().map(Vec::len).sum::<usize>() as u64
    }
}

/// One micro-step of an L=5 model, B=2, T=4; returns the loss and gradients as bits.
fn step(model: &Gpt, acts: &mut Activations) -> Vec<u32> {
    let params = init_params(model.config(), model.layout(), 7);
    let mut grads: Vec<Vec<f32>> = params.iter().map(|p| vec![0.0; p.len()]).collect();
    let tokens: Vec<u32> = (0..8).map(|i| (i * 5 % 32) as u32).collect();
    let targets: Vec<u32> = (0..8).map(|i| (i * 3 % 32) as u32).collect();
    let loss = model
        .forward_backward(acts, &params, &mut grads, &tokens, &targets)
        .unwrap();
    std::iter::once(loss.to_bits())
        .chain(grads.iter().flatten().map(|g| g.to_bits()))
        .collect()
}

#[test]
fn the_model_keeps_every_segment_then_restores_each_after_hinting_it() {
    let config = GptConfig::new(4, 32, 5, 2, 8).unwrap();
    let model = Gpt::new(config).unwrap();
    for every in [1, 2] {
        let segments = 5usize.div_ceil(every);
        let calls = Arc::new(Mutex::new(Vec::new()));
        let recording = Recording {
            inputs: vec![vec![0.0; 2 * 4 * 8]; segments],
            calls: Arc::clone(&calls),
        };
        let no_alloc_for_kept = |which: usize, len: usize| -> Result<super::Buffer> {
            assert_ne!(which, super::KEPT_INPUTS, "the kept inputs were allocated");
            Ok(Box::new(vec![0f32; len]))
        };
        let mut acts = Activations::with_kept_inputs(
            &config,
            2,
            4,
            Some(every),
            no_alloc_for_kept,
            Box::new(recording),
        )
        .unwrap();
        let got = step(&model, &mut acts);
        let mut plain = model.activations_checkpointed(2, 4, Some(every)).unwrap();
        assert!(
            got == step(&model, &mut plain),
            "every {every}: results differ"
        );
        assert_eq!(plain.bytes() - acts.bytes(), acts.offloaded_bytes());

        // Forward keeps 0..S; at the last, S-2 is hinted; backward restores S-2 down to 0,
        // each restore followed by the hint of the segment before it.
        let last = segments - 1;
        let mut expected: Vec<Call> = (0..segments).map(Call::Keep).collect();
        expected.push(Call::DueNext(last - 1));
        for s in (0..last).rev() {
            expected.push(Call::Restore(s));
            if s > 0 {
                expected.push(Call::DueNext(s - 1));
            }
        }
        assert_eq!(*calls.lock().unwrap(), expected, "every {every}");
    }
}

#[test]
fn kept_inputs_of_the_wrong_shape_are_refused() {
    let config = GptConfig::new(4, 32, 5, 2, 8).unwrap();
    let wrong = Recording {
        inputs: vec![vec![0.0; 64]; 2],
        calls: Arc::default(),
    };
    let alloc = |_: usize, len: usize| -> Result<super::Buffer> { Ok(Box::new(vec![0f32; len])) };
    let refused = Activations::with_kept_inputs(&config, 2, 4, Some(1), alloc, Box::new(wrong));
    assert!(refused.is_err());
}
