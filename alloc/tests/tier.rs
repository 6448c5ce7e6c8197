//! The file tier: every piece reads back as written whatever the piece and chunk sizes (a
//! piece larger than the pool's buffer is chunked) and wherever its memory lies (moved
//! straight or through the pool), pieces do not overwrite each other, and a
//! file of another run, rank or layout, or a shortened one, is refused naming its path and
//! what differs.

use proptest::prelude::*;
use std::path::PathBuf;
use zero_alloc::tier::{file_bytes, ChunkPool, TierFile, TierSpec, HEADER_BYTES, TIER_ALIGN};
use zero_alloc::{AllocError, PinnedBuffer};

/// A fresh folder under the system's temporary one.
struct Dir(PathBuf);

impl Dir {
    fn new(tag: &str) -> Self {
        let unique = format!(
            "zero-tier-{tag}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        );
        let dir = std::env::temp_dir().join(unique.replace(['(', ')'], ""));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    fn spec(&self, run: u64) -> TierSpec<'_> {
        TierSpec {
            dir: &self.0,
            tier: "optimizer",
            rank: 1,
            world: 2,
            run,
        }
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn bytes(seed: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| (i.wrapping_mul(31).wrapping_add(seed * 7) % 251) as u8)
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn pieces_read_back_as_written_whatever_the_chunk(
        lens in prop::collection::vec(0u64..20_000, 1..6),
        chunk in 1usize..3 * TIER_ALIGN,
        order in prop::collection::vec(any::<usize>(), 6),
        shift in prop::sample::select(vec![0usize, 256, 512, 1]),
    ) {
        let dir = Dir::new("prop");
        let tier = TierFile::create(dir.spec(9), &lens).unwrap();
        let mut pool = ChunkPool::new(1, chunk).unwrap();
        // Memory `shift` bytes past a page: moved straight (0, and 512 where the kernel
        // takes it) or through the pool (1, 256).
        let mut memory = PinnedBuffer::new(20_000 + 512 + 1).unwrap();
        let at = |len: u64| shift..shift + len as usize;
        // Written in a shuffled order, each twice (the second value wins).
        let mut shuffled: Vec<usize> = (0..lens.len()).collect();
        shuffled.sort_by_key(|&p| order[p]);
        for pass in 0..2u64 {
            for &p in &shuffled {
                let data = &mut memory.as_bytes_mut()[at(lens[p])];
                data.copy_from_slice(&bytes(p as u64 + 10 * pass, lens[p] as usize));
                tier.write_piece(p, data, &mut pool).unwrap();
            }
        }
        for (p, &len) in lens.iter().enumerate() {
            let out = &mut memory.as_bytes_mut()[at(len)];
            out.fill(0xAA);
            tier.read_piece(p, out, &mut pool).unwrap();
            prop_assert_eq!(&*out, &bytes(p as u64 + 10, len as usize)[..], "piece {}", p);
        }
        let slots: u64 = lens.iter().map(|l| l.next_multiple_of(TIER_ALIGN as u64)).sum();
        prop_assert_eq!(tier.file_bytes(), HEADER_BYTES as u64 + slots);
        prop_assert_eq!(file_bytes(&lens).unwrap(), HEADER_BYTES as u64 + slots);
        prop_assert_eq!(std::fs::metadata(tier.path()).unwrap().len(), tier.file_bytes());
    }
}

fn mismatch(err: AllocError) -> (PathBuf, &'static str, String, String) {
    match err {
        AllocError::TierMismatch {
            path,
            what,
            expected,
            found,
        } => (path, what, expected, found),
        other => panic!("expected a mismatch, got {other}"),
    }
}

#[test]
fn a_file_of_another_run_rank_or_layout_or_a_shortened_one_is_refused() {
    let dir = Dir::new("refuse");
    let lens = [5000, 10];
    let made = TierFile::create(dir.spec(1), &lens).unwrap();
    let path = made.path().to_path_buf();
    let mut pool = ChunkPool::new(1, 4096).unwrap();
    made.write_piece(0, &bytes(3, 5000), &mut pool).unwrap();
    drop(made);
    assert!(TierFile::open(dir.spec(1), &lens).is_ok());
    let (p, what, expected, found) = mismatch(TierFile::open(dir.spec(2), &lens).unwrap_err());
    assert_eq!(
        (p, what, expected.as_str(), found.as_str()),
        (path.clone(), "run", "0x2", "0x1")
    );
    let (_, what, _, _) = mismatch(TierFile::open(dir.spec(1), &[5000, 11]).unwrap_err());
    assert_eq!(what, "layout");
    let text = TierFile::open(dir.spec(1), &[5000])
        .unwrap_err()
        .to_string();
    assert!(
        text.contains(&path.display().to_string()) && text.contains("pieces"),
        "{text}"
    );
    // Shortened behind the tier's back: refused at open, and by a read of an open file.
    let open = TierFile::open(dir.spec(1), &lens).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(6000)
        .unwrap();
    let (_, what, _, found) = mismatch(TierFile::open(dir.spec(1), &lens).unwrap_err());
    assert_eq!((what, found.as_str()), ("file length", "6000"));
    let mut out = vec![0u8; 5000];
    let (_, what, _, _) = mismatch(open.read_piece(0, &mut out, &mut pool).unwrap_err());
    assert_eq!(what, "file length");
    std::fs::write(&path, b"not a tier").unwrap();
    let (_, what, _, found) = mismatch(TierFile::open(dir.spec(1), &lens).unwrap_err());
    assert_eq!(what, "header");
    assert!(found.contains("shorter"), "{found}");
}

#[test]
fn wrong_pieces_and_lengths_are_errors_not_panics() {
    let dir = Dir::new("bad");
    let tier = TierFile::create(dir.spec(1), &[100]).unwrap();
    let mut pool = ChunkPool::new(1, 4096).unwrap();
    assert!(tier.write_piece(1, &[0; 100], &mut pool).is_err());
    assert!(tier.write_piece(0, &[0; 99], &mut pool).is_err());
    assert!(tier.read_piece(0, &mut [0; 101], &mut pool).is_err());
    let long = TierSpec {
        tier: "a name of seventeen",
        ..dir.spec(1)
    };
    assert!(TierFile::create(long, &[1]).is_err());
    assert!(ChunkPool::new(0, 4096).is_err() && ChunkPool::new(1, 0).is_err());
    assert!(TierFile::create(dir.spec(1), &[u64::MAX]).is_err());
    let missing = TierSpec {
        dir: std::path::Path::new("/nonexistent/zero"),
        ..dir.spec(1)
    };
    let err = TierFile::create(missing, &[1]).unwrap_err();
    assert!(matches!(err, AllocError::TierIo { .. }), "{err}");
}

#[test]
fn a_file_in_use_is_refused_to_a_second_creator_and_keeps_its_bytes() {
    let dir = Dir::new("claimed");
    let lens = [5000];
    let first = TierFile::create(dir.spec(1), &lens).unwrap();
    let mut pool = ChunkPool::new(1, 4096).unwrap();
    first.write_piece(0, &bytes(7, 5000), &mut pool).unwrap();
    let err = TierFile::create(dir.spec(2), &lens).unwrap_err();
    assert!(
        matches!(&err, AllocError::TierIo { path, .. } if path == first.path()),
        "{err}"
    );
    assert!(err.to_string().contains("another engine holds it"), "{err}");
    let mut out = vec![0u8; 5000];
    first.read_piece(0, &mut out, &mut pool).unwrap();
    assert_eq!(out, bytes(7, 5000), "the refused creator emptied nothing");
    drop(first);
    let second = TierFile::create(dir.spec(2), &lens).unwrap();
    second.read_piece(0, &mut out, &mut pool).unwrap();
    assert_eq!(out, vec![0u8; 5000], "a creator empties the file it claims");
}

/// A file its disk cannot hold is refused when it is created, naming its path, the bytes
/// it needs and the bytes free, and leaves no file behind; a file that fits was reserved,
/// so no later write of it can find the disk full. The refusal comes from the free bytes,
/// before any block is taken: the tests beside this one share its disk.
#[test]
fn a_file_its_disk_cannot_hold_is_refused_at_creation_naming_the_bytes() {
    let dir = Dir::new("no-space");
    // 8 TiB: more than this machine's disks, within ext4's, xfs's and tmpfs's file size.
    let lens = [8u64 << 40];
    let err = match TierFile::create(dir.spec(1), &lens) {
        Err(e) => e,
        Ok(file) => {
            // A filesystem without `fallocate` keeps the file sparse: nothing to check.
            eprintln!("skipped: {} was not reserved here", file.path().display());
            return;
        }
    };
    let AllocError::TierNoSpace {
        path,
        bytes,
        available,
    } = &err
    else {
        panic!("not a no-space refusal: {err}");
    };
    assert!(*bytes > lens[0], "{err}");
    assert!(available.is_some_and(|a| a < *bytes), "{err}");
    let text = err.to_string();
    assert!(
        text.contains(&bytes.to_string()) && text.contains("free"),
        "{text}"
    );
    assert!(!path.exists(), "the refused file was left behind: {text}");
    // One that fits is created, and its bytes are on the disk, not a hole.
    let file = TierFile::create(dir.spec(1), &[1 << 20]).unwrap();
    let meta = std::fs::metadata(file.path()).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert!(meta.blocks() * 512 >= 1 << 20, "{} blocks", meta.blocks());
}

/// Memory aligned as the file's direct I/O asks moves straight: only a piece's last partial
/// 4 KiB block goes through the pool. Memory off that alignment goes through it whole.
#[test]
fn only_what_direct_io_refuses_goes_through_the_pool() {
    let dir = Dir::new("pooled");
    let lens = [3 * TIER_ALIGN as u64 + 100, 2 * TIER_ALIGN as u64];
    let tier = TierFile::create(dir.spec(1), &lens).unwrap();
    let mut pool = ChunkPool::new(1, TIER_ALIGN).unwrap();
    let mut memory = PinnedBuffer::new(4 * TIER_ALIGN + 1).unwrap();
    let align = tier.memory_alignment();
    // Page-aligned memory: straight wherever the kernel asks at most a page.
    let aligned = &mut memory.as_bytes_mut()[..lens[0] as usize];
    tier.write_piece(0, aligned, &mut pool).unwrap();
    tier.read_piece(0, aligned, &mut pool).unwrap();
    assert_eq!(tier.pooled_bytes(), 2 * 100, "alignment {align}");
    // One byte past a page: refused by any direct I/O, so through the pool, all of it.
    let shifted = &mut memory.as_bytes_mut()[1..1 + lens[1] as usize];
    tier.write_piece(1, shifted, &mut pool).unwrap();
    let expected = match align {
        1 => 2 * 100,
        _ => 2 * 100 + lens[1],
    };
    assert_eq!(tier.pooled_bytes(), expected, "alignment {align}");
}
