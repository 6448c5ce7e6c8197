//! One test per arena rule: placement, coalescing, handles, defragmentation, statistics,
//! accounting mode, views.

use half::{bf16, f16};
use zero_alloc::{AllocError, Arena, ArenaConfig, Backing, Device};

const A: usize = 256;

#[test]
fn blocks_are_aligned_and_rounded() {
    let mut arena = Arena::host(16 * A).unwrap();
    let a = arena.alloc(1).unwrap();
    let b = arena.alloc(A + 1).unwrap();
    assert_eq!(arena.block(a).unwrap().size, A);
    assert_eq!(arena.block(b).unwrap().offset, A);
    assert_eq!(arena.block(b).unwrap().size, 2 * A);
    assert_eq!(arena.block(b).unwrap().len, A + 1);
    assert_eq!(arena.stats().allocated, 3 * A);
}

#[test]
fn zero_byte_request_takes_one_unit() {
    let mut arena = Arena::host(4 * A).unwrap();
    let a = arena.alloc(0).unwrap();
    let b = arena.alloc(0).unwrap();
    assert_ne!(
        arena.block(a).unwrap().offset,
        arena.block(b).unwrap().offset
    );
    assert!(arena.slice::<f32>(a).unwrap().is_empty());
}

#[test]
fn placement_is_best_fit() {
    let mut arena = Arena::host(16 * A).unwrap();
    let h: Vec<_> = (0..6)
        .map(|i| arena.alloc(if i % 2 == 0 { 3 * A } else { A }).unwrap())
        .collect();
    // holes: 3 units at 0, 3 units at 4, and the 4-unit tail at 12
    arena.free(h[0]).unwrap();
    arena.free(h[2]).unwrap();
    let small = arena.alloc(A).unwrap();
    assert_eq!(
        arena.block(small).unwrap().offset,
        0,
        "smallest fitting hole, lowest offset"
    );
    let four = arena.alloc(4 * A).unwrap();
    assert_eq!(
        arena.block(four).unwrap().offset,
        12 * A,
        "only the tail fits four units"
    );
}

#[test]
fn frees_coalesce_with_both_neighbours() {
    let mut arena = Arena::host(3 * A).unwrap();
    let h: Vec<_> = (0..3).map(|_| arena.alloc(A).unwrap()).collect();
    arena.free(h[0]).unwrap();
    arena.free(h[2]).unwrap();
    assert_eq!(arena.stats().largest_free, A);
    arena.free(h[1]).unwrap();
    assert_eq!(arena.free_ranges(), vec![(0, 3 * A)]);
    assert_eq!(arena.stats().fragmentation, 0.0);
}

#[test]
fn double_free_is_an_error() {
    let mut arena = Arena::host(4 * A).unwrap();
    let a = arena.alloc(10).unwrap();
    arena.free(a).unwrap();
    assert!(matches!(arena.free(a), Err(AllocError::StaleHandle { .. })));
}

#[test]
fn stale_handle_does_not_alias_a_reused_slot() {
    let mut arena = Arena::host(4 * A).unwrap();
    let old = arena.alloc(10).unwrap();
    arena.free(old).unwrap();
    let new = arena.alloc(10).unwrap();
    assert_ne!(old, new);
    assert!(matches!(
        arena.slice::<u8>(old),
        Err(AllocError::StaleHandle { .. })
    ));
    assert!(arena.contains(new));
}

#[test]
fn foreign_handle_is_an_error() {
    let mut one = Arena::host(4 * A).unwrap();
    let mut two = Arena::host(4 * A).unwrap();
    let h = one.alloc(10).unwrap();
    let _ = two.alloc(10).unwrap();
    assert!(matches!(two.free(h), Err(AllocError::ForeignHandle { .. })));
    assert!(matches!(
        two.block(h),
        Err(AllocError::ForeignHandle { .. })
    ));
}

#[test]
fn defragment_preserves_bytes_and_updates_handles() {
    let mut arena = Arena::host(8 * A).unwrap();
    let h: Vec<_> = (0..4).map(|_| arena.alloc(A + 8).unwrap()).collect();
    for (i, &hi) in h.iter().enumerate() {
        arena
            .slice_mut::<u8>(hi)
            .unwrap()
            .iter_mut()
            .enumerate()
            .for_each(|(j, x)| *x = (i * 31 + j) as u8);
    }
    arena.free(h[0]).unwrap();
    arena.free(h[2]).unwrap();
    let report = arena.defragment().unwrap();
    assert_eq!(report.blocks_moved, 2);
    assert_eq!(report.bytes_moved, 2 * (A as u64 + 8));
    assert_eq!(arena.block(h[1]).unwrap().offset, 0);
    assert_eq!(arena.block(h[3]).unwrap().offset, 2 * A);
    for i in [1, 3] {
        let bytes = arena.slice::<u8>(h[i]).unwrap();
        assert!(bytes
            .iter()
            .enumerate()
            .all(|(j, &x)| x == (i * 31 + j) as u8));
    }
    let s = arena.stats();
    assert_eq!(s.largest_free, s.total_free);
    assert_eq!((s.defrags, s.bytes_moved), (1, 2 * (A as u64 + 8)));
}

#[test]
fn pinned_blocks_stay_put_during_defragment() {
    let mut arena = Arena::host(8 * A).unwrap();
    let h: Vec<_> = (0..5).map(|_| arena.alloc(A).unwrap()).collect();
    arena.free(h[0]).unwrap();
    arena.free(h[2]).unwrap();
    arena.pin(h[1]).unwrap();
    arena.slice_mut::<u8>(h[4]).unwrap().fill(4);
    arena.defragment().unwrap();
    assert_eq!(
        arena.block(h[1]).unwrap().offset,
        A,
        "pinned block did not move"
    );
    assert_eq!(
        arena.block(h[3]).unwrap().offset,
        0,
        "hole before the pin was filled"
    );
    assert_eq!(
        arena.block(h[4]).unwrap().offset,
        2 * A,
        "the rest packed after the pin"
    );
    assert_eq!(arena.free_ranges(), vec![(3 * A, 5 * A)]);
    assert!(arena.slice::<u8>(h[4]).unwrap().iter().all(|&x| x == 4));
    arena.unpin(h[1]).unwrap();
}

#[test]
fn hole_before_a_pin_too_small_for_later_blocks_stays() {
    let mut arena = Arena::host(8 * A).unwrap();
    let small = arena.alloc(A).unwrap();
    let pinned = arena.alloc(A).unwrap();
    let big = arena.alloc(2 * A).unwrap();
    arena.free(small).unwrap();
    arena.pin(pinned).unwrap();
    arena.defragment().unwrap();
    assert_eq!(arena.block(big).unwrap().offset, 2 * A);
    assert_eq!(arena.free_ranges(), vec![(0, A), (4 * A, 4 * A)]);
}

#[test]
fn pinned_block_cannot_be_freed_or_viewed() {
    let mut arena = Arena::host(4 * A).unwrap();
    let h = arena.alloc(A).unwrap();
    arena.pin(h).unwrap();
    arena.pin(h).unwrap();
    assert!(matches!(
        arena.free(h),
        Err(AllocError::Pinned { pins: 2, .. })
    ));
    assert!(matches!(
        arena.slice::<u8>(h),
        Err(AllocError::Pinned { .. })
    ));
    arena.unpin(h).unwrap();
    arena.unpin(h).unwrap();
    assert!(matches!(arena.unpin(h), Err(AllocError::NotPinned { .. })));
    arena.free(h).unwrap();
}

#[test]
fn fragmented_allocation_defragments_and_retries() {
    let mut arena = Arena::host(4 * A).unwrap();
    let h: Vec<_> = (0..4).map(|_| arena.alloc(A).unwrap()).collect();
    arena.slice_mut::<u8>(h[1]).unwrap().fill(9);
    arena.free(h[0]).unwrap();
    arena.free(h[2]).unwrap();
    let big = arena.alloc(2 * A).unwrap();
    assert_eq!(arena.block(big).unwrap().offset, 2 * A);
    assert_eq!(arena.stats().defrags, 1);
    assert!(arena.slice::<u8>(h[1]).unwrap().iter().all(|&x| x == 9));
}

#[test]
fn fragmented_allocation_fails_when_auto_defrag_is_off() {
    let config = ArenaConfig::new(4 * A).defragment_on_fragmentation(false);
    let mut arena = Arena::new(config).unwrap();
    let h: Vec<_> = (0..4).map(|_| arena.alloc(A).unwrap()).collect();
    arena.free(h[0]).unwrap();
    arena.free(h[2]).unwrap();
    assert!(matches!(
        arena.alloc(2 * A),
        Err(AllocError::OutOfMemory { .. })
    ));
    assert_eq!(arena.stats().defrags, 0);
    assert!((arena.stats().fragmentation - 0.5).abs() < 1e-12);
}

#[test]
fn out_of_memory_carries_request_and_stats() {
    let mut arena = Arena::host(4 * A).unwrap();
    let _a = arena.alloc(3 * A).unwrap();
    let err = arena.alloc(2 * A).unwrap_err();
    let AllocError::OutOfMemory {
        requested,
        rounded,
        ref stats,
        ..
    } = err
    else {
        panic!("expected OOM, got {err}");
    };
    assert_eq!((requested, rounded), (2 * A, 2 * A));
    assert_eq!(stats.allocated, 3 * A);
    assert_eq!(stats.ooms, 1);
    let text = err.to_string();
    assert!(text.contains("out of memory on cpu"), "{text}");
    assert!(text.contains("requested 512 B"), "{text}");
    assert!(
        text.contains("allocated 768 B of capacity 1.00 KiB"),
        "{text}"
    );
    assert_eq!(arena.stats().ooms, 1);
}

#[test]
fn huge_request_is_an_error_not_a_panic() {
    let mut arena = Arena::host(4 * A).unwrap();
    assert!(matches!(
        arena.alloc(usize::MAX),
        Err(AllocError::SizeOverflow { .. })
    ));
    assert!(matches!(
        arena.alloc_elems::<f32>(usize::MAX / 2),
        Err(AllocError::SizeOverflow { .. })
    ));
}

#[test]
fn stats_track_peak_and_counts() {
    let mut arena = Arena::host(16 * A).unwrap();
    let a = arena.alloc(4 * A).unwrap();
    let b = arena.alloc(4 * A).unwrap();
    arena.free(a).unwrap();
    let s = arena.stats();
    assert_eq!(
        (s.allocated, s.peak_allocated, s.reserved),
        (4 * A, 8 * A, 8 * A)
    );
    assert_eq!((s.allocs, s.frees, s.live_blocks), (2, 1, 1));
    assert_eq!(s.total_free, 12 * A);
    arena.reset_peak();
    assert_eq!(arena.stats().peak_allocated, 4 * A);
    arena.free(b).unwrap();
    assert_eq!(arena.stats().peak_allocated, 4 * A);
}

#[test]
fn accounting_arena_places_a_trillion_parameters() {
    // 1e12 parameters at 16 bytes each (fp16 params + grads, fp32 master + Adam moments).
    let psi: usize = 1_000_000_000_000;
    let mut arena = Arena::accounting(16 * psi + (1 << 30)).unwrap();
    let params = arena.alloc_elems::<f16>(psi).unwrap();
    let _grads = arena.alloc_elems::<f16>(psi).unwrap();
    let _master = arena.alloc_elems::<f32>(psi).unwrap();
    let _m = arena.alloc_elems::<f32>(psi).unwrap();
    let _v = arena.alloc_elems::<f32>(psi).unwrap();
    assert_eq!(arena.stats().allocated, 16 * psi);
    assert!(matches!(
        arena.slice::<f16>(params),
        Err(AllocError::NoHostMemory { .. })
    ));
    arena.free(params).unwrap();
    arena.defragment().unwrap();
    assert_eq!(arena.stats().bytes_moved, 14 * psi as u64);
}

#[test]
fn capacity_is_rounded_down_to_alignment() {
    let arena = Arena::host(4 * A + 17).unwrap();
    assert_eq!(arena.stats().capacity, 4 * A);
}

#[test]
fn alignment_must_be_power_of_two() {
    let err = Arena::new(ArenaConfig::new(1024).alignment(48)).unwrap_err();
    assert!(matches!(err, AllocError::InvalidConfig { .. }));
}

#[test]
fn cuda_without_feature_or_driver_is_a_clean_error() {
    let result = Arena::new(ArenaConfig::new(1024).device(Device::Cuda(0)));
    if cfg!(feature = "cuda") {
        // With the feature, a machine without a driver must still fail cleanly.
        if let Err(err) = result {
            assert!(!err.to_string().is_empty());
        }
    } else {
        assert!(matches!(
            result,
            Err(AllocError::NotCompiledWithCuda { .. })
        ));
    }
}

#[test]
fn typed_views_cover_all_element_types() {
    let mut arena = Arena::host(64 * A).unwrap();
    let f = arena.alloc_elems::<f32>(5).unwrap();
    let b = arena.alloc_elems::<bf16>(5).unwrap();
    let h = arena.alloc_elems::<f16>(5).unwrap();
    let u = arena.alloc_elems::<u16>(5).unwrap();
    let i = arena.alloc_elems::<i32>(5).unwrap();
    let x = arena.alloc_elems::<u8>(5).unwrap();
    arena.slice_mut::<f32>(f).unwrap().fill(1.25);
    arena
        .slice_mut::<bf16>(b)
        .unwrap()
        .fill(bf16::from_f32(2.0));
    arena.slice_mut::<f16>(h).unwrap().fill(f16::from_f32(3.0));
    arena.slice_mut::<u16>(u).unwrap().fill(4);
    arena.slice_mut::<i32>(i).unwrap().fill(-5);
    arena.slice_mut::<u8>(x).unwrap().fill(6);
    assert_eq!(arena.slice::<f32>(f).unwrap(), &[1.25; 5]);
    assert_eq!(arena.slice::<bf16>(b).unwrap()[4].to_f32(), 2.0);
    assert_eq!(arena.slice::<f16>(h).unwrap()[4].to_f32(), 3.0);
    assert_eq!(arena.slice::<u16>(u).unwrap(), &[4; 5]);
    assert_eq!(arena.slice::<i32>(i).unwrap(), &[-5; 5]);
    assert_eq!(arena.slice::<u8>(x).unwrap(), &[6; 5]);
    // The bf16 block viewed as its raw bits.
    assert_eq!(
        arena.slice::<u16>(b).unwrap()[0],
        bf16::from_f32(2.0).to_bits()
    );
}

#[test]
fn view_with_non_dividing_type_is_an_error() {
    let mut arena = Arena::host(4 * A).unwrap();
    let h = arena.alloc(6).unwrap();
    assert!(matches!(
        arena.slice::<f32>(h),
        Err(AllocError::BadView { .. })
    ));
    assert_eq!(arena.slice::<u16>(h).unwrap().len(), 3);
}

#[test]
fn several_mutable_views_of_distinct_blocks() {
    let mut arena = Arena::host(16 * A).unwrap();
    let p = arena.alloc_elems::<f32>(4).unwrap();
    let g = arena.alloc_elems::<f32>(4).unwrap();
    let m = arena.alloc_elems::<f32>(4).unwrap();
    arena
        .slice_mut::<f32>(p)
        .unwrap()
        .copy_from_slice(&[1.0, 2.0, 3.0, 4.0]);
    {
        let [params, grads, moments] = arena.slices_mut::<f32, 3>([p, g, m]).unwrap();
        grads.copy_from_slice(params);
        for (mo, gr) in moments.iter_mut().zip(grads.iter()) {
            *mo = gr * 2.0;
        }
    }
    assert_eq!(arena.slice::<f32>(m).unwrap(), &[2.0, 4.0, 6.0, 8.0]);
    assert_eq!(arena.slice::<f32>(g).unwrap(), &[1.0, 2.0, 3.0, 4.0]);
}

#[test]
fn repeated_handle_in_mutable_views_is_refused() {
    let mut arena = Arena::host(16 * A).unwrap();
    let p = arena.alloc_elems::<f32>(4).unwrap();
    assert!(matches!(
        arena.slices_mut::<f32, 2>([p, p]),
        Err(AllocError::AlreadyBorrowed { .. })
    ));
    let mut views = arena.views();
    let _a = views.get::<f32>(p).unwrap();
    let _b = views.get::<f32>(p).unwrap();
    assert!(matches!(
        views.get_mut::<f32>(p),
        Err(AllocError::AlreadyBorrowed { .. })
    ));
}

#[test]
fn arena_is_send_for_rank_threads() {
    fn assert_send<T: Send>() {}
    assert_send::<Arena>();
    let mut arena = Arena::host(4 * A).unwrap();
    let h = arena.alloc_elems::<u8>(3).unwrap();
    let arena = std::thread::spawn(move || {
        arena.slice_mut::<u8>(h).unwrap().fill(1);
        arena
    })
    .join()
    .unwrap();
    assert_eq!(arena.slice::<u8>(h).unwrap(), &[1, 1, 1]);
}

#[test]
fn pinned_backing_arena_works_locked_or_not() {
    let mut arena = Arena::new(ArenaConfig::new(4 * A).backing(Backing::Pinned)).unwrap();
    let h = arena.alloc(A).unwrap();
    arena.slice_mut::<u8>(h).unwrap().fill(3);
    assert_eq!(arena.slice::<u8>(h).unwrap()[A - 1], 3);
}

#[test]
fn byte_copies_check_length_and_mode() {
    let mut arena = Arena::host(4 * A).unwrap();
    let h = arena.alloc(8).unwrap();
    arena.write_bytes(h, &[1, 2, 3]).unwrap();
    let mut out = [0u8; 3];
    arena.read_bytes(h, &mut out).unwrap();
    assert_eq!(out, [1, 2, 3]);
    assert!(matches!(
        arena.write_bytes(h, &[0; 9]),
        Err(AllocError::LengthMismatch { .. })
    ));
    assert!(matches!(
        arena.read_bytes(h, &mut [0; 9]),
        Err(AllocError::LengthMismatch { .. })
    ));
    let mut acct = Arena::accounting(4 * A).unwrap();
    let g = acct.alloc(8).unwrap();
    assert!(matches!(
        acct.write_bytes(g, &[1]),
        Err(AllocError::NoHostMemory { .. })
    ));
}

#[test]
fn byte_copies_at_an_offset_touch_only_that_range() {
    let mut arena = Arena::host(4 * A).unwrap();
    let h = arena.alloc(8).unwrap();
    let neighbour = arena.alloc(8).unwrap();
    arena.slice_mut::<u8>(neighbour).unwrap().fill(9);
    arena.write_bytes(h, &[0; 8]).unwrap();
    arena.write_at(h, 5, &[7, 8, 9]).unwrap();
    assert_eq!(arena.slice::<u8>(h).unwrap(), &[0, 0, 0, 0, 0, 7, 8, 9]);
    let mut out = [0u8; 2];
    arena.read_at(h, 6, &mut out).unwrap();
    assert_eq!(out, [8, 9]);
    // Past the block, and offsets that overflow: errors, and nothing written.
    for (offset, len) in [(6, 3), (9, 0), (usize::MAX, 1)] {
        let err = arena.write_at(h, offset, &vec![1; len]);
        assert!(
            matches!(err, Err(AllocError::LengthMismatch { .. })),
            "{offset} {len}"
        );
        let err = arena.read_at(h, offset, &mut vec![0; len]);
        assert!(
            matches!(err, Err(AllocError::LengthMismatch { .. })),
            "{offset} {len}"
        );
    }
    assert_eq!(arena.slice::<u8>(h).unwrap(), &[0, 0, 0, 0, 0, 7, 8, 9]);
    assert!(arena
        .slice::<u8>(neighbour)
        .unwrap()
        .iter()
        .all(|&b| b == 9));
}

#[test]
fn handles_lists_exactly_the_live_blocks() {
    let mut arena = Arena::host(8 * A).unwrap();
    let a = arena.alloc(1).unwrap();
    let b = arena.alloc(1).unwrap();
    let c = arena.alloc(1).unwrap();
    arena.free(b).unwrap();
    let mut live = arena.handles();
    live.sort_by_key(|h| arena.block(*h).unwrap().offset);
    assert_eq!(live, vec![a, c]);
}
