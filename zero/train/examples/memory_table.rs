//! Model-state bytes per rank measured from the arena beside the paper's formula, for every
//! stage at N_d = 1, 2, 4, 8: the table in docs/zero.md.
//!
//! `cargo run --release -p zero-train --example memory_table -- [PRESET] [fp32|bf16|fp16]`
//! (defaults: `small`, `bf16`, the paper's K = 12 case).

use zero::{Engine, EngineConfig, Precision, ZeroStage};
use zero_gpt::{GptConfig, ParamLayout};
use zero_train::bridge::gpt_units;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let preset = args.next().unwrap_or_else(|| "small".into());
    let precision = match args.next().as_deref().unwrap_or("bf16") {
        "fp32" => Precision::Fp32,
        "bf16" => Precision::Bf16,
        "fp16" => Precision::Fp16,
        other => return Err(format!("unknown precision {other}").into()),
    };
    let config = GptConfig::preset(&preset)?;
    let units = gpt_units(&ParamLayout::new(&config));
    let psi: usize = units.iter().map(|u| u.numel).sum();
    let mib = |b: f64| b / (1 << 20) as f64;
    println!("{preset}: {psi} parameters, {precision:?} (MiB per rank)\n");
    println!("| N_d | stage | measured | formula | padding | measured / stage 0 |");
    println!("|---:|---:|---:|---:|---:|---:|");
    for world in [1, 2, 4, 8] {
        let mut stage0 = 0.0;
        for stage in ZeroStage::ALL {
            let comms = zero_comm::local::create(world)?;
            let measured = std::thread::scope(|s| {
                let handles: Vec<_> = comms
                    .into_iter()
                    .map(|comm| {
                        let units = units.clone();
                        s.spawn(move || {
                            let cfg = EngineConfig {
                                stage,
                                precision,
                                ..EngineConfig::default()
                            };
                            // Parameter values do not change the footprint: skip the init;
                            // no program runs.
                            let e = Engine::new(comm, units, &[], cfg, |_, _| {})?;
                            Ok::<_, zero::Error>((
                                e.measured_model_state_bytes()?,
                                e.expected_model_state_bytes(),
                            ))
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().expect("rank thread"))
                    .collect::<Result<Vec<_>, _>>()
            })?;
            // Rank 0 carries no more than any other rank: shards are equal.
            let (m, f) = measured[0];
            if stage == ZeroStage::Zero0 {
                stage0 = m.total();
            }
            println!(
                "| {world} | {} | {:.2} | {:.2} | {:.3} | {:.3} |",
                stage as u8,
                mib(m.total()),
                mib(f.total()),
                mib(m.total() - f.total()),
                m.total() / stage0
            );
        }
    }
    Ok(())
}
