//! The finer units of a split block: at T > 1 each block's slice is two engine units, its
//! attention's and its MLP's, so ZeRO stage 3 holds one of them gathered at a time, never
//! the whole block slice. Shown on a T = 2 x DP = 2 run at stage 3: its measured peak is
//! the plan, and the plan's transient bytes are below the engine's own plan of the same
//! programs with each block's two slices merged into one unit, by at least the attention
//! slice's f32 copy and f32 gradient (derived from the tensor shapes).

mod common;
use common::{learnable_corpus, TempDir};

use zero::{plan_memory, Op, Program, UnitSpec, ZeroStage};
use zero_gpt::{GptConfig, ParamLayout, TpOp};
use zero_train::bridge::{gpt_units, TpPrograms};
use zero_train::plan::memory_fit::MemoryQuery;
use zero_train::{train, ByteSize, TrainConfig};

/// The coarse unit of fine unit `u` of a split layout of `layers` blocks: each block's
/// attention slice (`1 + 3l`) and MLP slice (`2 + 3l`) one unit (`1 + 2l`), its replicated
/// unit `2 + 2l`, the units after the blocks shifted down by L.
fn coarse(u: usize, layers: usize) -> usize {
    match u {
        0 => 0,
        u if u <= 3 * layers => 1 + 2 * ((u - 1) / 3) + usize::from((u - 1) % 3 == 2),
        u => u - layers,
    }
}

/// `ids` through [`coarse`], each coarse unit once.
fn merged(ids: &[usize], layers: usize) -> Vec<usize> {
    let mut out: Vec<usize> = Vec::new();
    for c in ids.iter().map(|&u| coarse(u, layers)) {
        if !out.contains(&c) {
            out.push(c);
        }
    }
    out
}

/// The engine's stage-3 transient bytes for `query`'s programs with each block's slice one
/// unit: the units and every op's reads and writes merged by [`coarse`].
fn whole_slice_transient(query: &MemoryQuery) -> u64 {
    let layout = query.layout();
    let layers = layout.num_layers();
    let fine = gpt_units(&layout);
    let mut units: Vec<UnitSpec> = Vec::new();
    for (u, spec) in fine.iter().enumerate() {
        match units.get_mut(coarse(u, layers)) {
            Some(slice) => slice.numel += spec.numel,
            None => units.push(UnitSpec::new(spec.name.clone(), spec.numel)),
        }
        units[coarse(u, layers)].tp_sharded = spec.tp_sharded;
    }
    let programs = TpPrograms::new(&layout, None).unwrap();
    let program = |p: &Program<TpOp>| {
        let ops = p.ops().iter().map(|op| {
            let mut o = Op::new(op.kind)
                .reads(merged(&op.reads, layers))
                .writes(merged(&op.writes, layers));
            (o.keeps, o.restores) = (op.keeps, op.restores);
            o
        });
        Program::new(ops.collect(), units.len()).unwrap()
    };
    let coarse_programs = [&programs.train, &programs.forward, &programs.logits].map(program);
    let schedules: Vec<_> = coarse_programs.iter().map(Program::schedule).collect();
    plan_memory(&units, &schedules, query.shape)
        .unwrap()
        .transient
}

#[test]
fn stage_3_holds_one_slice_of_a_block_gathered_not_the_whole_block_slice() {
    let dir = TempDir::new("tp-units");
    learnable_corpus(&dir.0);
    let cfg = TrainConfig {
        model: "tiny".into(),
        seq_len: 16,
        data: dir.0.clone(),
        world_size: 4,
        tensor_parallel_size: 2,
        zero_stage: ZeroStage::Zero3,
        steps: 1,
        batch_size: 4,
        micro_batch_size: 1,
        eval_every: 0,
        sample_tokens: 0,
        memory_limit: Some(ByteSize(1 << 30)),
        ..TrainConfig::default()
    };
    let model = GptConfig::tiny();
    let query = MemoryQuery::for_flags(&cfg, model, 2).with(ZeroStage::Zero3, None);
    let plan = query.plan().unwrap();
    // Tiny (C = 32) at T = 2: the attention slice (4C² + 3C)/2 and the MLP slice
    // (8C² + 4C)/2 elements per rank.
    let layout = query.layout();
    let [attention, mlp, _] = ParamLayout::split_block_units(0).map(|u| layout.units()[u].len);
    assert_eq!((attention, mlp), (2096, 4160));
    let whole_slice = whole_slice_transient(&query);
    // Merged, the MLP backward holds the attention half's f32 copy and f32 gradient beside
    // the MLP half's (one unit), so the whole-slice plan is higher by at least those.
    let attention_half = 2 * 4 * attention as u64;
    assert!(
        plan.transient + attention_half <= whole_slice,
        "transient {} bytes, a whole block slice's {whole_slice}",
        plan.transient
    );
    let run = train(&cfg).unwrap();
    let fixed = plan.total() - plan.transient;
    for rank in &run.ranks {
        assert_eq!(rank.peak_bytes, plan.total(), "rank {}", rank.rank);
        assert!(rank.peak_bytes - fixed + attention_half <= whole_slice);
    }
    eprintln!(
        "stage 3, T = 2: transient {} bytes planned and measured; with each block's slice one \
         unit {whole_slice}",
        plan.transient
    );
}
