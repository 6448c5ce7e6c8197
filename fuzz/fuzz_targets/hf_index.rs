//! Fuzz target: the parser of Hugging Face's `model.safetensors.index.json` must never
//! panic, and every shard it accepts must be a plain file name (nothing that leaves the
//! index's folder).
#![no_main]

use libfuzzer_sys::fuzz_target;
use zero_train::checkpoint::parse_hf_index;

fuzz_target!(|data: &[u8]| {
    let Ok(map) = parse_hf_index(data) else {
        return;
    };
    for shard in map.values() {
        assert!(!shard.is_empty() && shard != "." && shard != "..", "{shard:?}");
        assert!(!shard.contains(['/', '\\', '\0']), "{shard:?}");
    }
});
