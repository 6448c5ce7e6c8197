//! Fuzz target: the GPT-2 safetensors reader must never panic, and must never allocate more
//! than the input's tensors justify; a model it accepts must export and read back bit-exactly.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zero_train::checkpoint::{export_safetensors, read_safetensors, read_safetensors_bytes, SafetensorsDtype};

fuzz_target!(|data: &[u8]| {
    // The first byte chooses the head count (1..=4); the rest is the file.
    let Some((&heads, file)) = data.split_first() else {
        return;
    };
    let Ok((cfg, units)) = read_safetensors_bytes(file, usize::from(heads % 4) + 1) else {
        return;
    };
    let lens: Vec<usize> = units.iter().map(Vec::len).collect();
    assert_eq!(lens, zero_gpt::ParamLayout::new(&cfg).unit_lens());
    let path = std::env::temp_dir().join(format!("fuzz-st-{}.safetensors", std::process::id()));
    export_safetensors(&cfg, units.iter(), SafetensorsDtype::F32, &path).expect("export");
    let (again_cfg, again) = read_safetensors(&path, Some(cfg.num_heads)).expect("re-read");
    assert_eq!(again_cfg, cfg);
    let bits = |u: &[Vec<f32>]| u.iter().flatten().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&again), bits(&units));
});
