//! The harness of the tier tests (`engine_nvme`, `engine_param_offload`): a fake model of
//! four units no world size divides evenly, trained on a local group, its exported states
//! compared as bits.

use super::FnModel;
use std::path::{Path, PathBuf};
use zero::{Engine, EngineConfig, EngineOps, Error, OpUnits, Program, UnitSpec, UnitState};

/// Unit sizes that no world size divides evenly; 4096 spans several pieces.
pub const SIZES: [usize; 4] = [1000, 7, 4096, 333];

/// A folder of its own under the system's temporary one, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        let n = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let dir = std::env::temp_dir().join(format!("zero-nvme-{tag}-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Forward over every unit, then backward in reverse.
pub fn program() -> Program<(bool, usize)> {
    super::sequential(SIZES.len())
}

/// The fake model: each backward gives the parameters times the step's factor as gradient.
pub fn micro_step(e: &mut Engine, factor: f32) -> Result<(), Error> {
    let mut model = FnModel::new(move |&(back, _): &(bool, usize), units: &mut OpUnits<'_>| {
        if back {
            let (p, mut g) = units.views()?;
            for (g, p) in g[0].iter_mut().zip(p[0]) {
                *g = p * factor;
            }
        }
        Ok(())
    });
    e.micro_step(&program(), &mut model)
}

pub fn engine(
    comm: zero_comm::Communicator,
    config: EngineConfig,
    dir: Option<&Path>,
) -> Result<Engine, Error> {
    let units = SIZES
        .iter()
        .enumerate()
        .map(|(i, &n)| UnitSpec::new(format!("u{i}"), n))
        .collect();
    let ops = EngineOps::host().with_nvme_path(dir.map(Path::to_path_buf));
    Engine::with_ops(comm, units, &[program().schedule()], config, ops, |u, w| {
        for (i, x) in w.iter_mut().enumerate() {
            *x = ((u * 31 + i) % 17) as f32 * 0.1 - 0.8;
        }
    })
}

/// Runs `f` on every rank of a local group of `world` and collects the results.
pub fn on_ranks<R: Send>(world: usize, f: impl Fn(zero_comm::Communicator) -> R + Sync) -> Vec<R> {
    let comms = zero_comm::local::create(world).unwrap();
    std::thread::scope(|s| {
        let hs: Vec<_> = comms.into_iter().map(|c| s.spawn(|| f(c))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Rank 0's exported states after each of three steps, as bits.
pub fn trained(world: usize, config: EngineConfig, dir: Option<&Path>) -> Vec<Vec<u32>> {
    let mut runs = on_ranks(world, |c| {
        let mut e = engine(c, config, dir).unwrap();
        (0..3)
            .map(|step| {
                // Small gradients: fp16 at its initial loss scale takes these steps.
                micro_step(&mut e, 1e-3 * (1.0 + step as f32)).unwrap();
                e.step(1e-2).unwrap();
                bits(&e.export_states().unwrap())
            })
            .collect::<Vec<_>>()
    });
    runs.swap_remove(0)
}

pub fn bits(states: &[UnitState]) -> Vec<u32> {
    states
        .iter()
        .flat_map(|s| s.params.iter().chain(&s.m).chain(&s.v))
        .map(|x| x.to_bits())
        .collect()
}
