//! Tensor parallelism beside ZeRO (`zero::tensor_parallel`) on the MLP split Megatron-style
//! (`examples/mlp_tp`): the conjugate operators on rank-valued inputs against their sums
//! written out; the grid's groups; at T = 1 the split model is the un-split one to the bit;
//! at T = 2 its slices are the un-split tensors', its losses and clipped norms agree with the
//! un-split model's to 1e-5 (each block's sums are split in two), and its stages agree to
//! the bit.

#[path = "../examples/mlp/model.rs"]
#[allow(dead_code)]
mod mlp;
#[path = "../examples/mlp_tp/model.rs"]
#[allow(dead_code)]
mod model;

use mlp::{init, micro_batch, Mlp, Shape};
use model::{TpMlp, TpShape};
use zero::tensor_parallel::{copy_to_tp, reduce_from_tp, Grid};
use zero::{Engine, EngineConfig, ZeroStage};

const NET: Shape = Shape {
    inputs: 6,
    hidden: 8,
    classes: 3,
    blocks: 3,
    batch: 4,
};
const STEPS: usize = 3;

fn on_ranks<R: Send>(n: usize, f: impl Fn(zero_comm::Communicator) -> R + Sync) -> Vec<R> {
    let comms = zero_comm::local::create(n).unwrap();
    std::thread::scope(|s| {
        let hs: Vec<_> = comms.into_iter().map(|c| s.spawn(|| f(c))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn the_conjugate_operators_sum_where_megatron_sums_and_pass_through_elsewhere() {
    let got = on_ranks(3, |tp| {
        let r = tp.rank() as f32;
        let mut x = vec![r + 1.0, 10.0 * r];
        reduce_from_tp::forward(&tp, &mut x).unwrap(); // g: sums
        let mut dx = vec![r; 2];
        reduce_from_tp::backward(&tp, &mut dx).unwrap(); // g': passes
        let mut y = vec![r; 2];
        copy_to_tp::forward(&tp, &mut y).unwrap(); // f: passes
        let mut dy = vec![r * r, 1.0];
        copy_to_tp::backward(&tp, &mut dy).unwrap(); // f': sums
        (r, x, dx, y, dy)
    });
    for (r, x, dx, y, dy) in got {
        assert_eq!(x, [1.0 + 2.0 + 3.0, 0.0 + 10.0 + 20.0]);
        assert_eq!((dx, y), (vec![r; 2], vec![r; 2]));
        assert_eq!(dy, [0.0 + 1.0 + 4.0, 3.0]);
    }
}

#[test]
fn the_grid_puts_tensor_parallel_ranks_side_by_side() {
    let got = on_ranks(6, |world| {
        let r = world.rank();
        let grid = Grid::new(&world, 2).unwrap();
        let mut sum = [r as f32];
        grid.tp
            .all_reduce_in_place(&mut sum, zero_comm::ReduceOp::Sum)
            .unwrap();
        let sizes = (grid.tp.size(), grid.dp.size());
        (
            r,
            grid.tp.rank(),
            grid.dp.rank(),
            sizes,
            sum[0],
            Grid::new(&world, 4).is_err(),
        )
    });
    for (r, tp_rank, dp_rank, sizes, sum, refused) in got {
        assert_eq!((tp_rank, dp_rank, sizes), (r % 2, r / 2, (2, 3)));
        let pair = (r - r % 2) as f32;
        assert_eq!(sum, pair + pair + 1.0, "rank {r} sums with its neighbour");
        assert!(
            refused,
            "a tensor-parallel size of 4 does not divide 6 ranks"
        );
    }
}

/// What a run gives on rank `0` of every tensor-parallel group: losses, norms, and its units.
type Run = (Vec<u32>, Vec<f32>, Vec<Vec<f32>>);

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn config(stage: ZeroStage, grad_clip: f32) -> EngineConfig {
    EngineConfig {
        stage,
        grad_clip,
        reduce_bucket_bytes: 256,
        ..EngineConfig::default()
    }
}

/// T x 2 ranks of the split model; rank 0's run.
fn split_run(tp: usize, stage: ZeroStage, grad_clip: f32) -> Run {
    let runs = on_ranks(tp * 2, |world| {
        let grid = Grid::new(&world, tp).unwrap();
        let shape = TpShape {
            net: NET,
            tp,
            tp_rank: grid.tp.rank(),
        };
        let train = shape.train_program();
        let dp_index = grid.dp.rank();
        let engine_tp = grid.tp.split(0, 0).unwrap();
        let cfg = config(stage, grad_clip);
        let mut e = Engine::new(grid.dp, shape.units(), &[train.schedule()], cfg, |u, w| {
            shape.init(u, w)
        })
        .unwrap()
        .with_tensor_parallel(engine_tp);
        let mut m = TpMlp::new(shape, grid.tp);
        let (mut losses, mut norms) = (vec![], vec![]);
        for step in 0..STEPS {
            let (x, y) = micro_batch(&NET, step, 0, dp_index);
            m.set_batch(x, y);
            e.micro_step(&train, &mut m).unwrap();
            losses.push(m.loss);
            norms.push(e.step(1e-2).unwrap().grad_norm);
        }
        let units = (0..shape.units().len())
            .map(|u| e.read_params(u).unwrap())
            .collect();
        (bits(&losses), norms, units)
    });
    runs.into_iter().next().unwrap()
}

/// The un-split MLP on 2 ranks; rank 0's run.
fn plain_run(stage: ZeroStage, grad_clip: f32) -> Run {
    let runs = on_ranks(2, |comm| {
        let train = NET.train_program(None);
        let rank = comm.rank();
        let mut e = Engine::new(
            comm,
            NET.units(),
            &[train.schedule()],
            config(stage, grad_clip),
            |u, w| init(&NET, u, w),
        )
        .unwrap();
        let mut m = Mlp::new(NET, None, vec![], vec![]);
        let (mut losses, mut norms) = (vec![], vec![]);
        for step in 0..STEPS {
            let (x, y) = micro_batch(&NET, step, 0, rank);
            m.set_batch(x, y);
            e.micro_step(&train, &mut m).unwrap();
            losses.push(m.loss);
            norms.push(e.step(1e-2).unwrap().grad_norm);
        }
        let units = (0..NET.blocks + 2)
            .map(|u| e.read_params(u).unwrap())
            .collect();
        (bits(&losses), norms, units)
    });
    runs.into_iter().next().unwrap()
}

#[test]
fn at_t_1_the_split_model_is_the_unsplit_one_to_the_bit() {
    // No clipping: the norm's sums run over other units in another order.
    let (plain, split) = (
        plain_run(ZeroStage::Zero2, 0.0),
        split_run(1, ZeroStage::Zero2, 0.0),
    );
    assert_eq!(plain.0, split.0, "losses");
    // A block of the un-split model is [W1, b1, W2, b2]: the slice unit then the bias unit.
    let h = NET.hidden;
    for l in 0..NET.blocks {
        let whole = &plain.2[1 + l];
        let (slice, b2) = (&split.2[1 + 2 * l], &split.2[2 + 2 * l]);
        assert_eq!(bits(&whole[..2 * h * h + h]), bits(slice), "block {l}");
        assert_eq!(bits(&whole[2 * h * h + h..]), bits(b2), "block {l} b2");
    }
}

#[test]
fn at_t_2_each_rank_starts_from_its_slice_of_the_unsplit_tensors() {
    let h = NET.hidden;
    let mut whole = vec![0.0; 2 * h * h + 2 * h];
    init(&NET, 2, &mut whole); // block 1
    let (w1, rest) = whole.split_at(h * h);
    let (b1, w2) = (&rest[..h], &rest[h..h + h * h]);
    for tp_rank in 0..2 {
        let shape = TpShape {
            net: NET,
            tp: 2,
            tp_rank,
        };
        let mut slice = vec![0.0; shape.units()[3].numel];
        shape.init(3, &mut slice); // block 1's slice
        let rows = tp_rank * h / 2..(tp_rank + 1) * h / 2;
        let mut want: Vec<f32> = w1[rows.start * h..rows.end * h].to_vec();
        want.extend(&b1[rows.clone()]);
        for o in 0..h {
            want.extend(&w2[o * h + rows.start..o * h + rows.end]);
        }
        assert_eq!(bits(&slice), bits(&want), "rank {tp_rank}");
    }
}

#[test]
fn at_t_2_losses_and_clipped_norms_agree_with_t_1_and_stages_to_the_bit() {
    // The un-split model on the engine without a tensor-parallel group: its norm is the
    // reference the split one must reproduce.
    let one = plain_run(ZeroStage::Zero3, 0.05);
    let base = split_run(2, ZeroStage::Zero0, 0.05);
    let close = |a: f32, b: f32| (a - b).abs() <= 1e-5 * a.abs().max(1e-3);
    for (a, b) in one.0.iter().zip(&base.0) {
        let (a, b) = (f32::from_bits(*a), f32::from_bits(*b));
        assert!(close(a, b), "losses {a} vs {b}");
    }
    // Clipping is on (the norms are above 0.05): a replicated unit counted twice, or a slice
    // once, would move the norm far past 1e-5.
    assert!(one.1.iter().all(|&n| n > 0.05));
    for (a, b) in one.1.iter().zip(&base.1) {
        assert!(close(*a, *b), "norms {a} vs {b}");
    }
    for stage in [ZeroStage::Zero1, ZeroStage::Zero2, ZeroStage::Zero3] {
        let other = split_run(2, stage, 0.05);
        assert_eq!(base.0, other.0, "{stage}: losses");
        assert_eq!(bits(&base.1), bits(&other.1), "{stage}: norms");
        for (u, (a, b)) in base.2.iter().zip(&other.2).enumerate() {
            assert_eq!(bits(a), bits(b), "{stage}: unit {u}");
        }
    }
}
