//! Fuzz target: the llm.c checkpoint parser must never panic or allocate from an unchecked
//! header; its in-memory and streaming entry points must agree, and accepted checkpoints
//! must round-trip bit-exactly, including through the per-unit layout.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zero_train::checkpoint::LlmcCheckpoint;

fn bits(c: &LlmcCheckpoint) -> Vec<u32> {
    c.params().iter().map(|x| x.to_bits()).collect()
}

fuzz_target!(|data: &[u8]| {
    let in_memory = LlmcCheckpoint::from_bytes(data);
    let streamed = LlmcCheckpoint::read_from(data);
    match (in_memory, streamed) {
        (Ok(a), Ok(b)) => {
            assert_eq!(a.shape(), b.shape());
            assert_eq!(bits(&a), bits(&b));
            let again = LlmcCheckpoint::from_bytes(&a.to_bytes()).map(|c| bits(&c));
            assert_eq!(again.ok(), Some(bits(&a)));
            let units = a.to_units().map(|u| LlmcCheckpoint::from_units(*a.shape(), &u).map(|c| bits(&c)));
            assert_eq!(units.ok().and_then(Result::ok), Some(bits(&a)));
        }
        (Err(_), Err(_)) => {}
        (a, b) => panic!("entry points disagree: {a:?} vs {b:?}"),
    }
});
