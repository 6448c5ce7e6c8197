//! CUDA arenas (feature `cuda`). On a machine without the driver every constructor must
//! return a clean error; with a GPU the same rules as the host arena are checked on device
//! memory, through byte copies since device blocks have no CPU slices.
#![cfg(feature = "cuda")]

use zero_alloc::{AllocError, Arena, ArenaConfig, CopyEngine, Device, PinnedBuffer};

/// The CUDA arena, or None (after checking the error is the clean one) without a GPU.
fn cuda_arena(capacity: usize) -> Option<Arena> {
    match Arena::new(ArenaConfig::new(capacity).device(Device::Cuda(0))) {
        Ok(arena) => Some(arena),
        Err(AllocError::CudaUnavailable { .. }) => None,
        Err(AllocError::Cuda { message, .. }) if message.contains("NO_DEVICE") => None,
        Err(other) => panic!("unexpected error opening a CUDA arena: {other}"),
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed))
        .collect()
}

#[test]
fn cuda_arena_round_trips_bytes() {
    let Some(mut arena) = cuda_arena(1 << 20) else {
        return;
    };
    let h = arena.alloc(5000).unwrap();
    arena.write_bytes(h, &pattern(5000, 1)).unwrap();
    let mut back = vec![0u8; 5000];
    arena.read_bytes(h, &mut back).unwrap();
    assert_eq!(back, pattern(5000, 1));
    assert!(matches!(
        arena.slice::<u8>(h),
        Err(AllocError::NoHostMemory { .. })
    ));
    assert_ne!(arena.device_view(h).unwrap().ptr(), 0);
}

#[test]
fn cuda_defragment_preserves_overlapping_moves() {
    let Some(mut arena) = cuda_arena(1 << 20) else {
        return;
    };
    // A small hole before a large block: the move overlaps itself, exercising the chunking.
    let gap = arena.alloc(256).unwrap();
    let big = arena.alloc(100_000).unwrap();
    arena.write_bytes(big, &pattern(100_000, 7)).unwrap();
    arena.free(gap).unwrap();
    arena.defragment().unwrap();
    assert_eq!(arena.block(big).unwrap().offset, 0);
    let mut back = vec![0u8; 100_000];
    arena.read_bytes(big, &mut back).unwrap();
    assert_eq!(back, pattern(100_000, 7));
}

#[test]
fn cuda_offload_through_copy_stream() {
    let Some(mut arena) = cuda_arena(1 << 20) else {
        return;
    };
    let engine = CopyEngine::new().unwrap();
    let h = arena.alloc(4096).unwrap();
    arena.write_bytes(h, &pattern(4096, 3)).unwrap();
    let buf = PinnedBuffer::cuda(0, 4096).unwrap();
    assert!(buf.is_locked());
    let buf = engine
        .to_host(&mut arena, h, 0..4096, buf)
        .unwrap()
        .wait(&mut arena)
        .unwrap();
    assert_eq!(buf.as_bytes(), pattern(4096, 3).as_slice());
}

#[test]
fn cuda_pinned_buffer_falls_back_without_driver() {
    let buf = PinnedBuffer::cuda(0, 64).unwrap();
    assert_eq!(buf.len(), 64);
    if cuda_arena(256).is_none() {
        assert!(
            buf.fallback_reason().is_some(),
            "no driver: the buffer must say why it fell back"
        );
    }
}
