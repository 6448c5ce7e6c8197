//! Offload copies: completion handles, pinning while in flight, double buffering.

use zero_alloc::{offload_double_buffered, AllocError, Arena, CopyEngine, PinnedBuffer};

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
}

#[test]
fn round_trip_through_pinned_buffer() {
    let engine = CopyEngine::new().unwrap();
    let mut arena = Arena::host(1 << 16).unwrap();
    let h = arena.alloc(3000).unwrap();
    arena.write_bytes(h, &pattern(3000)).unwrap();

    let t = engine
        .to_host(&mut arena, h, 0..3000, PinnedBuffer::new(3000).unwrap())
        .unwrap();
    let mut buf = t.wait(&mut arena).unwrap();
    assert_eq!(buf.as_bytes(), pattern(3000).as_slice());

    buf.as_bytes_mut()
        .iter_mut()
        .for_each(|x| *x = x.wrapping_add(1));
    let t = engine.to_arena(&mut arena, buf, h, 0..3000).unwrap();
    let _buf = t.wait(&mut arena).unwrap();
    let expect: Vec<u8> = pattern(3000).iter().map(|x| x.wrapping_add(1)).collect();
    assert_eq!(arena.slice::<u8>(h).unwrap(), expect.as_slice());
}

#[test]
fn sub_range_copies_land_at_the_buffer_start() {
    let engine = CopyEngine::new().unwrap();
    let mut arena = Arena::host(1 << 16).unwrap();
    let h = arena.alloc(1000).unwrap();
    arena.write_bytes(h, &pattern(1000)).unwrap();
    let t = engine
        .to_host(&mut arena, h, 100..300, PinnedBuffer::new(512).unwrap())
        .unwrap();
    let buf = t.wait(&mut arena).unwrap();
    assert_eq!(&buf.as_bytes()[..200], &pattern(1000)[100..300]);
}

#[test]
fn block_is_pinned_until_wait() {
    let engine = CopyEngine::new().unwrap();
    let mut arena = Arena::host(8 * 256).unwrap();
    let gap = arena.alloc(256).unwrap();
    let h = arena.alloc(256).unwrap();
    let other = arena.alloc(256).unwrap();
    arena.free(gap).unwrap();
    let t = engine
        .to_host(&mut arena, h, 0..256, PinnedBuffer::new(256).unwrap())
        .unwrap();
    assert!(matches!(arena.free(h), Err(AllocError::Pinned { .. })));
    assert!(matches!(
        arena.slice::<u8>(h),
        Err(AllocError::Pinned { .. })
    ));
    arena.defragment().unwrap();
    assert_eq!(
        arena.block(h).unwrap().offset,
        256,
        "in-flight block stayed put"
    );
    assert_eq!(
        arena.block(other).unwrap().offset,
        0,
        "moved into the hole before it"
    );
    assert_eq!(arena.stats().pinned_blocks, 1);
    t.wait(&mut arena).unwrap();
    assert_eq!(arena.stats().pinned_blocks, 0);
    arena.free(h).unwrap();
}

#[test]
fn transfer_completes_and_reports_done() {
    let engine = CopyEngine::new().unwrap();
    let mut arena = Arena::host(1 << 12).unwrap();
    let h = arena.alloc(64).unwrap();
    let t = engine
        .to_host(&mut arena, h, 0..64, PinnedBuffer::new(64).unwrap())
        .unwrap();
    while !t.is_done() {
        std::thread::yield_now();
    }
    assert_eq!(t.handle(), h);
    t.wait(&mut arena).unwrap();
}

#[test]
fn dropping_arena_and_transfer_mid_flight_is_safe() {
    let engine = CopyEngine::new().unwrap();
    let mut arena = Arena::host(1 << 20).unwrap();
    let h = arena.alloc(1 << 20).unwrap();
    let t = engine
        .to_host(
            &mut arena,
            h,
            0..(1 << 20),
            PinnedBuffer::new(1 << 20).unwrap(),
        )
        .unwrap();
    drop(arena); // the job holds the memory alive
    drop(t);
    drop(engine); // joins after the queued copy ran
}

#[test]
fn out_of_range_copies_are_refused() {
    let engine = CopyEngine::new().unwrap();
    let mut arena = Arena::host(1 << 12).unwrap();
    let h = arena.alloc(100).unwrap();
    let err = engine
        .to_host(&mut arena, h, 50..150, PinnedBuffer::new(100).unwrap())
        .unwrap_err();
    assert!(matches!(err, AllocError::LengthMismatch { .. }));
    let err = engine
        .to_host(&mut arena, h, 0..100, PinnedBuffer::new(10).unwrap())
        .unwrap_err();
    assert!(matches!(err, AllocError::LengthMismatch { .. }));
    assert_eq!(
        arena.stats().pinned_blocks,
        0,
        "a refused copy leaves nothing pinned"
    );
}

#[test]
fn accounting_arena_cannot_offload() {
    let engine = CopyEngine::new().unwrap();
    let mut arena = Arena::accounting(1 << 12).unwrap();
    let h = arena.alloc(100).unwrap();
    let err = engine
        .to_host(&mut arena, h, 0..100, PinnedBuffer::new(100).unwrap())
        .unwrap_err();
    assert!(matches!(err, AllocError::NoHostMemory { .. }));
}

#[test]
fn double_buffered_offload_streams_every_chunk_in_order() {
    let engine = CopyEngine::new().unwrap();
    let mut arena = Arena::host(1 << 16).unwrap();
    let h = arena.alloc(10_000).unwrap();
    arena.write_bytes(h, &pattern(10_000)).unwrap();
    let bufs = [
        PinnedBuffer::new(4096).unwrap(),
        PinnedBuffer::new(4096).unwrap(),
    ];
    let mut seen = Vec::new();
    let mut chunks = Vec::new();
    let bufs = offload_double_buffered(&engine, &mut arena, h, bufs, |chunk, bytes| {
        chunks.push(chunk);
        seen.extend_from_slice(bytes);
        Ok(())
    })
    .unwrap();
    assert_eq!(seen, pattern(10_000));
    let in_flight: Vec<_> = chunks.iter().map(|c| c.in_flight).collect();
    assert_eq!(
        in_flight,
        vec![1, 1, 0],
        "the next chunk was in flight during compute"
    );
    assert_eq!(
        chunks.iter().map(|c| c.offset).collect::<Vec<_>>(),
        vec![0, 4096, 8192]
    );
    assert_eq!(bufs.map(|b| b.len()), [4096, 4096]);
    assert_eq!(arena.stats().pinned_blocks, 0);
}

#[test]
fn double_buffered_offload_stops_on_consumer_error_and_unpins() {
    let engine = CopyEngine::new().unwrap();
    let mut arena = Arena::host(1 << 16).unwrap();
    let h = arena.alloc(10_000).unwrap();
    let bufs = [
        PinnedBuffer::new(1024).unwrap(),
        PinnedBuffer::new(1024).unwrap(),
    ];
    let mut calls = 0;
    let err = offload_double_buffered(&engine, &mut arena, h, bufs, |_, _| {
        calls += 1;
        Err(AllocError::CopyEngineGone)
    })
    .unwrap_err();
    assert!(matches!(err, AllocError::CopyEngineGone));
    assert_eq!(calls, 1);
    assert_eq!(arena.stats().pinned_blocks, 0);
    arena.free(h).unwrap();
}

#[test]
fn double_buffered_offload_rejects_mismatched_buffers() {
    let engine = CopyEngine::new().unwrap();
    let mut arena = Arena::host(1 << 12).unwrap();
    let h = arena.alloc(100).unwrap();
    let bufs = [
        PinnedBuffer::new(64).unwrap(),
        PinnedBuffer::new(32).unwrap(),
    ];
    let err = offload_double_buffered(&engine, &mut arena, h, bufs, |_, _| Ok(())).unwrap_err();
    assert!(matches!(err, AllocError::LengthMismatch { .. }));
}

#[test]
fn a_waited_copy_says_when_it_ran_and_what_it_moved() {
    let engine = CopyEngine::new().unwrap();
    let mut arena = Arena::host(1 << 16).unwrap();
    let h = arena.alloc(4096).unwrap();
    let submitted = std::time::Instant::now();
    let t = engine
        .to_host(&mut arena, h, 96..1096, PinnedBuffer::new(1000).unwrap())
        .unwrap();
    let (buf, timing) = t.wait_timed(&mut arena).unwrap();
    let waited = std::time::Instant::now();
    assert_eq!((timing.bytes, timing.to_host), (1000, true));
    assert!(submitted <= timing.started && timing.started <= timing.finished);
    assert!(timing.finished <= waited);
    let t = engine.to_arena(&mut arena, buf, h, 0..10).unwrap();
    let (_, timing) = t.wait_timed(&mut arena).unwrap();
    assert_eq!((timing.bytes, timing.to_host), (10, false));
}
