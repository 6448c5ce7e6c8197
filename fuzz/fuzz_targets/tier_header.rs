//! Fuzz target: a tier file's header parser must never panic, and every header it accepts
//! must encode back to bytes that parse to the same header.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zero_alloc::tier::{TierHeader, HEADER_BYTES};

fuzz_target!(|data: &[u8]| {
    let Ok(header) = TierHeader::decode(data) else {
        return;
    };
    let bytes = header.encode();
    assert_eq!(bytes.len(), HEADER_BYTES);
    assert_eq!(TierHeader::decode(&bytes), Ok(header));
});
