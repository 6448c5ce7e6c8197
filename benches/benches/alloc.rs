//! Criterion benches of the alloc layer.
//!
//! - `alloc_free`: allocate/free pairs of mixed sizes (256 B .. 1 MiB) with a sliding window
//!   of live blocks, arena against the system allocator (same sizes, same 256-byte alignment).
//! - `defragment`: one `Arena::defragment()` of a half-fragmented 64 MiB arena, against a
//!   plain memcpy of the same number of bytes between two fresh buffers, both reported in
//!   bytes/s (Throughput::Bytes of the bytes the defragmentation moves). Every iteration gets
//!   fresh memory whose pages are touched during setup, outside the timing.
use std::alloc::{alloc, dealloc, Layout};
use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use zero_alloc::{Arena, ArenaConfig};

/// Sizes from a fixed LCG so every run and both contenders see the same sequence.
fn mixed_sizes(n: usize) -> Vec<usize> {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            256usize << ((state >> 33) % 13) // 256 B .. 1 MiB
        })
        .collect()
}

const WINDOW: usize = 64;
const PAIRS: usize = 4096;

fn alloc_free(c: &mut Criterion) {
    let sizes = mixed_sizes(PAIRS);
    let mut group = c.benchmark_group("alloc_free");
    group.throughput(Throughput::Elements(PAIRS as u64));
    group.bench_function("arena", |b| {
        let mut arena = Arena::new(ArenaConfig::new(256 << 20)).expect("reserve bench arena");
        b.iter(|| {
            let mut live = std::collections::VecDeque::with_capacity(WINDOW);
            for &size in &sizes {
                if live.len() == WINDOW {
                    arena
                        .free(live.pop_front().expect("window is full"))
                        .expect("free");
                }
                live.push_back(arena.alloc(black_box(size)).expect("alloc"));
            }
            for h in live {
                arena.free(h).expect("free");
            }
        });
    });
    group.bench_function("system", |b| {
        b.iter(|| {
            let mut live = std::collections::VecDeque::with_capacity(WINDOW);
            for &size in &sizes {
                if live.len() == WINDOW {
                    let (ptr, layout) = live.pop_front().expect("window is full");
                    // SAFETY: `ptr` came from `alloc` with this layout and is freed once.
                    unsafe { dealloc(ptr, layout) };
                }
                let layout = Layout::from_size_align(black_box(size), 256).expect("layout");
                // SAFETY: the layout has non-zero size.
                let ptr = unsafe { alloc(layout) };
                assert!(!ptr.is_null());
                live.push_back((ptr, layout));
            }
            for (ptr, layout) in live {
                // SAFETY: as above.
                unsafe { dealloc(ptr, layout) };
            }
        });
    });
    group.finish();
}

const ARENA_BYTES: usize = 64 << 20;

/// A 64 MiB arena filled with mixed blocks (4 KiB .. 1 MiB), every other block freed.
/// Returns the arena and the bytes a defragmentation will move.
fn fragmented_arena() -> (Arena, u64) {
    let mut arena = Arena::new(ArenaConfig::new(ARENA_BYTES)).expect("reserve bench arena");
    let mut handles = Vec::new();
    let mut sizes = mixed_sizes(4096).into_iter().map(|s| s.max(4096)).cycle();
    loop {
        let size = sizes.next().unwrap_or(4096);
        match arena.alloc(size) {
            Ok(h) => {
                arena.slice_mut::<u8>(h).expect("host view").fill(0xab); // touch every page
                handles.push(h);
            }
            Err(_) => break,
        }
    }
    for h in handles.iter().step_by(2) {
        arena.free(*h).expect("free");
    }
    // Every block after the first hole moves: the odd blocks.
    let moved = handles
        .iter()
        .skip(1)
        .step_by(2)
        .map(|h| arena.block(*h).expect("live").len as u64)
        .sum();
    (arena, moved)
}

fn defragment(c: &mut Criterion) {
    let (arena, moved) = fragmented_arena();
    let stats = arena.stats();
    eprintln!(
        "defragment: {} live blocks, {moved} bytes to move, fragmentation {:.1}%",
        stats.live_blocks,
        stats.fragmentation * 100.0
    );
    drop(arena);
    let mut group = c.benchmark_group("defragment");
    group.sample_size(20);
    group.throughput(Throughput::Bytes(moved));
    group.bench_function("arena_defragment", |b| {
        b.iter_batched(
            fragmented_arena,
            |(mut arena, expect)| {
                let report = arena.defragment().expect("defragment");
                assert_eq!(report.bytes_moved, expect);
                arena // dropped outside the timing
            },
            BatchSize::PerIteration,
        );
    });
    // Fresh, touched buffers per iteration, like the fresh arena above, so both copies
    // start from the same cache and TLB state.
    group.bench_function("memcpy_same_bytes", |b| {
        b.iter_batched(
            || (vec![0xabu8; moved as usize], vec![1u8; moved as usize]),
            |(src, mut dst)| {
                dst.copy_from_slice(black_box(&src));
                (src, dst)
            },
            BatchSize::PerIteration,
        );
    });
    group.finish();
}

criterion_group!(benches, alloc_free, defragment);
criterion_main!(benches);
