//! `zero-train`: the bundled GPT-2 trainer (placeholder until the trainer issue lands).
fn main() {
    eprintln!("zero-train: the trainer is not built yet");
    std::process::exit(2);
}
