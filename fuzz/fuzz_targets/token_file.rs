//! Fuzz target: the llm.c token-file parser must never panic, and both of its entry points
//! (in-memory and streaming) must agree; whatever it accepts must survive a write/read cycle.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zero_train::data::{TokenFile, GPT2_VOCAB};

fuzz_target!(|data: &[u8]| {
    let in_memory = TokenFile::from_bytes(data, GPT2_VOCAB);
    let streamed = TokenFile::read_from(data, GPT2_VOCAB);
    match (in_memory, streamed) {
        (Ok(a), Ok(b)) => {
            assert_eq!(a, b);
            let again = TokenFile::from_bytes(&a.to_bytes(), GPT2_VOCAB);
            assert_eq!(again.ok().as_ref(), Some(&a));
        }
        // The messages may differ: a stream stops reading one byte past the header's claim.
        (Err(_), Err(_)) => {}
        (a, b) => panic!("entry points disagree: {a:?} vs {b:?}"),
    }
});
