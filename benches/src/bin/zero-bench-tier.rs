//! `zero-bench-tier`: the file tier's throughput (`zero_alloc::tier`, the files of
//! `--offload-optimizer nvme` and `--offload-params nvme`) beside the disk's own sequential
//! bandwidth, measured in the same run through the same page-cache bypass.
//!
//! ```text
//! cargo run --release -p zero-benches --bin zero-bench-tier -- --dir /work/nvme --size 4G
//! ```
//! Three patterns, each on the raw file (`O_DIRECT` reads and writes of one chunk at a time
//! from one aligned buffer, what `dd iflag=direct bs=1M` does) and through the tier
//! (`TierFile::write_piece` / `read_piece` of pieces from page-aligned memory, as the
//! engine's host blocks lie, so they move straight; `--offset 256` moves them through the
//! tier's pool instead): every piece written, every piece read, and the optimizer stream's order
//! (write piece i-1, then read piece i+1, so both directions share the disk). Each figure is
//! the median of `--rounds` rounds that alternate raw and tier, so both see the same disk.
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use zero_alloc::tier::{ChunkPool, TierFile, TierSpec, TIER_ALIGN};
use zero_alloc::PinnedBuffer;
use zero_benches::size::parse_size;

/// The file tier's read and write throughput beside the raw disk's (sizes in bytes with
/// K/M/G = powers of 1024).
#[derive(Debug, Parser)]
#[command(name = "zero-bench-tier", version)]
#[command(args_override_self = true)]
struct Args {
    /// Folder of the files (the `--nvme-path` to measure); it needs twice `--size` free.
    #[arg(long, default_value_os_t = std::env::temp_dir())]
    dir: PathBuf,
    /// Bytes each pattern moves in each direction.
    #[arg(long, value_parser = parse_size, default_value = "2G")]
    size: u64,
    /// Bytes of one piece (the engine's pieces are one bucket of states).
    #[arg(long, value_parser = parse_size, default_value = "64M")]
    piece: u64,
    /// Bytes of one read or write: the tier's pool buffer and the raw file's block.
    #[arg(long, value_parser = parse_size, default_value = "1M")]
    chunk: u64,
    /// Bytes the tier's memory starts past a page boundary: 0 moves pieces straight
    /// between memory and the file; a shift direct I/O refuses (256) copies them through
    /// the tier's pool buffer.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u16).range(0..4096))]
    offset: u16,
    /// Rounds; each figure is the median.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=100))]
    rounds: u32,
}

/// What the run moves, checked against the machine's address space.
struct Shape {
    pieces: usize,
    piece: usize,
    chunk: usize,
}

impl Shape {
    fn new(args: &Args) -> Result<Self, String> {
        let usize_of = |v: u64, what: &str| {
            usize::try_from(v).map_err(|_| format!("--{what} {v} does not fit this machine"))
        };
        let (piece, chunk) = (
            usize_of(args.piece, "piece")?,
            usize_of(args.chunk, "chunk")?,
        );
        if piece == 0 || chunk == 0 || chunk % TIER_ALIGN != 0 {
            return Err(format!(
                "--piece must be positive and --chunk a positive multiple of {TIER_ALIGN}"
            ));
        }
        let pieces = usize_of(args.size / args.piece, "size")?;
        if pieces < 2 {
            return Err("--size must hold at least two pieces".into());
        }
        Ok(Self {
            pieces,
            piece,
            chunk,
        })
    }

    fn bytes(&self) -> u64 {
        (self.pieces * self.piece) as u64
    }
}

/// One way of moving piece `i` between memory and a file.
trait PieceIo {
    fn write(&mut self, i: usize) -> Result<(), String>;
    fn read(&mut self, i: usize) -> Result<(), String>;
}

/// The raw file: pieces at `i * piece`, moved one aligned chunk at a time.
struct Raw {
    file: File,
    buf: PinnedBuffer,
    shape: (usize, usize),
}

impl Raw {
    fn open(path: &Path, shape: &Shape) -> Result<Self, String> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
            .map_err(|e| format!("{}: cannot open with O_DIRECT: {e}", path.display()))?;
        let buf = PinnedBuffer::new(shape.chunk).map_err(|e| e.to_string())?;
        Ok(Self {
            file,
            buf,
            shape: (shape.piece.next_multiple_of(TIER_ALIGN), shape.chunk),
        })
    }

    fn each_chunk(
        &mut self,
        i: usize,
        mut op: impl FnMut(&File, &mut [u8], u64) -> std::io::Result<()>,
    ) -> Result<(), String> {
        let (piece, chunk) = self.shape;
        for at in (0..piece).step_by(chunk) {
            let n = (piece - at).min(chunk);
            let buf = &mut self.buf.as_bytes_mut()[..n];
            op(&self.file, buf, (i * piece + at) as u64).map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

impl PieceIo for Raw {
    fn write(&mut self, i: usize) -> Result<(), String> {
        self.each_chunk(i, |f, b, at| f.write_all_at(b, at))
    }
    fn read(&mut self, i: usize) -> Result<(), String> {
        self.each_chunk(i, |f, b, at| f.read_exact_at(b, at))
    }
}

/// The tier: one rank's file, pieces moved from and into `memory[offset..]`.
struct Tier {
    file: TierFile,
    pool: ChunkPool,
    memory: PinnedBuffer,
    at: std::ops::Range<usize>,
}

impl Tier {
    fn create(dir: &Path, shape: &Shape, offset: usize) -> Result<Self, String> {
        let spec = TierSpec {
            dir,
            tier: "bench",
            rank: 0,
            world: 1,
            run: 0x2e40_b3c4,
        };
        let lens = vec![shape.piece as u64; shape.pieces];
        let file = TierFile::create(spec, &lens).map_err(|e| e.to_string())?;
        let pool = ChunkPool::new(1, shape.chunk).map_err(|e| e.to_string())?;
        let mut memory = PinnedBuffer::new(offset + shape.piece).map_err(|e| e.to_string())?;
        let at = offset..offset + shape.piece;
        for (k, b) in memory.as_bytes_mut()[at.clone()].iter_mut().enumerate() {
            *b = (k % 251) as u8;
        }
        Ok(Self {
            file,
            pool,
            memory,
            at,
        })
    }

    fn data(&mut self) -> &mut [u8] {
        &mut self.memory.as_bytes_mut()[self.at.clone()]
    }
}

impl PieceIo for Tier {
    fn write(&mut self, i: usize) -> Result<(), String> {
        self.data()[0] = i as u8;
        let data = &self.memory.as_bytes()[self.at.clone()];
        self.file
            .write_piece(i, data, &mut self.pool)
            .map_err(|e| e.to_string())
    }
    fn read(&mut self, i: usize) -> Result<(), String> {
        let data = &mut self.memory.as_bytes_mut()[self.at.clone()];
        // The bytes written come back: a tier that moved nothing would be fast and wrong.
        // The bytes checked are spoiled first, so stale memory cannot pass.
        let want = |k: usize| if k == 0 { i as u8 } else { (k % 251) as u8 };
        for k in (0..data.len()).step_by(4093) {
            data[k] = !want(k);
        }
        self.file
            .read_piece(i, data, &mut self.pool)
            .map_err(|e| e.to_string())?;
        match (0..data.len()).step_by(4093).find(|&k| data[k] != want(k)) {
            Some(k) => Err(format!("piece {i} read back wrong at byte {k}")),
            None => Ok(()),
        }
    }
}

/// Seconds pattern `k` takes on `io`: 0 writes every piece, 1 reads every piece, 2 is the
/// optimizer stream's order (piece 0 read first, then write i-1 before read i+1).
fn pattern(io: &mut dyn PieceIo, pieces: usize, k: usize) -> Result<f64, String> {
    let clock = Instant::now();
    match k {
        0 => (0..pieces).try_for_each(|i| io.write(i))?,
        1 => (0..pieces).try_for_each(|i| io.read(i))?,
        _ => {
            io.read(0)?;
            for i in 0..pieces {
                if i >= 1 {
                    io.write(i - 1)?;
                }
                if i + 1 < pieces {
                    io.read(i + 1)?;
                }
            }
            io.write(pieces - 1)?;
        }
    }
    Ok(clock.elapsed().as_secs_f64())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn run(args: &Args) -> Result<(), String> {
    let shape = Shape::new(args)?;
    let raw_path = args.dir.join("zero-bench-tier.raw");
    let mut raw = Raw::open(&raw_path, &shape)?;
    let mut tier = Tier::create(&args.dir, &shape, usize::from(args.offset))?;
    match tier.file.is_direct() {
        true => eprintln!(
            "zero-bench-tier: the tier file bypasses the page cache; memory aligned to {} bytes moves straight",
            tier.file.memory_alignment()
        ),
        false => eprintln!("zero-bench-tier: the tier file is buffered here (no O_DIRECT)"),
    }
    let (mut raws, mut tiers) = (Vec::new(), Vec::new());
    for round in 0..args.rounds as usize {
        eprintln!("zero-bench-tier: round {} of {}", round + 1, args.rounds);
        let (mut r, mut t) = ([0.0; 3], [0.0; 3]);
        // Raw and tier take turns going first, so a disk that drifts favours neither.
        for k in 0..3 {
            if (round + k) % 2 == 0 {
                r[k] = pattern(&mut raw, shape.pieces, k)?;
                t[k] = pattern(&mut tier, shape.pieces, k)?;
            } else {
                t[k] = pattern(&mut tier, shape.pieces, k)?;
                r[k] = pattern(&mut raw, shape.pieces, k)?;
            }
        }
        raws.push(r);
        tiers.push(t);
    }
    let tier_path = tier.file.path().to_path_buf();
    drop((raw, tier));
    // The bench's files go; a failure to remove one is worth a line, not the results.
    for path in [&raw_path, &tier_path] {
        if let Err(e) = std::fs::remove_file(path) {
            eprintln!("zero-bench-tier: cannot remove {}: {e}", path.display());
        }
    }
    print_table(&shape, &raws, &tiers);
    Ok(())
}

fn print_table(shape: &Shape, raws: &[[f64; 3]], tiers: &[[f64; 3]]) {
    let gib = shape.bytes() as f64 / f64::from(1u32 << 30);
    println!(
        "# {} pieces of {} bytes ({gib:.2} GiB), chunks of {} bytes, median of {} rounds",
        shape.pieces,
        shape.piece,
        shape.chunk,
        raws.len()
    );
    println!("| pattern | bytes moved | raw (s) | raw GB/s | tier (s) | tier GB/s | tier / raw |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let names = ["write", "read", "write i-1, read i+1"];
    for (k, name) in names.iter().enumerate() {
        // The stream's order moves every piece both ways.
        let bytes = shape.bytes() as f64 * if k == 2 { 2.0 } else { 1.0 };
        let r = median(raws.iter().map(|s| s[k]).collect());
        let t = median(tiers.iter().map(|s| s[k]).collect());
        println!(
            "| {name} | {bytes:.0} | {r:.2} | {:.2} | {t:.2} | {:.2} | {:.0}% |",
            bytes / r / 1e9,
            bytes / t / 1e9,
            100.0 * r / t
        );
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("zero-bench-tier: {e}");
            ExitCode::FAILURE
        }
    }
}
