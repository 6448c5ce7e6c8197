//! Fuzz target: the parser of a sharded training state's `manifest.json` must never panic,
//! and every manifest it accepts must name piece files inside the state folder (every piece
//! in a listed file) and cover each unit's elements once per tensor.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::Path;
use zero_state::{parse_manifest, TENSORS};

fuzz_target!(|data: &[u8]| {
    let Ok(manifest) = parse_manifest(Path::new("state"), data) else {
        return;
    };
    for f in &manifest.files {
        assert!(!f.name.contains(['/', '\\', '\0']), "{:?}", f.name);
        assert!(!f.name.is_empty() && f.name != "." && f.name != "..");
    }
    for p in &manifest.pieces {
        assert!(manifest.files.iter().any(|f| f.name == p.file), "{:?}", p.file);
    }
    for (unit, u) in manifest.partitioning.units.iter().enumerate() {
        for tensor in TENSORS {
            let covered: u128 = manifest
                .pieces
                .iter()
                .filter(|p| p.unit == unit && p.tensor == tensor)
                .map(|p| u128::from(p.len))
                .sum();
            assert_eq!(covered, u128::from(u.numel), "unit{unit}/{tensor}");
        }
    }
});
