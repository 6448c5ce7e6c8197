//! `zero-bench`: an nccl-tests-style collective benchmark (placeholder until zero-comm lands).
fn main() {
    eprintln!("zero-bench: not built yet");
    std::process::exit(2);
}
