//! `zero_alloc::context::untracked_context` is the workspace's one owner of CUDA context
//! creation: a context opened anywhere else keeps cudarc's event tracking on, and the
//! workspace's device views would then record events before the kernels that use them.
//! No GPU is needed: this reads the workspace's sources.

use std::path::{Path, PathBuf};

/// The `.rs` files under `dir`, skipping build outputs.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() && path.file_name().is_some_and(|n| n != "target") {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn only_the_context_module_opens_cuda_contexts() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let owner = Path::new("alloc").join("src").join("context.rs");
    let mut files = Vec::new();
    for crate_dir in ["alloc", "comm", "zero", "benches"] {
        rust_files(&root.join(crate_dir), &mut files);
    }
    assert!(files.len() > 50, "found only {} sources", files.len());
    // Spelled in two halves so this file does not find itself.
    let opens = ["CudaContext::", "new("].concat();
    let offenders: Vec<_> = files
        .iter()
        .filter(|f| !f.ends_with(&owner))
        .filter(|f| std::fs::read_to_string(f).is_ok_and(|s| s.contains(&opens)))
        .collect();
    assert!(
        offenders.is_empty(),
        "open contexts through zero_alloc::context: {offenders:?}"
    );
}
