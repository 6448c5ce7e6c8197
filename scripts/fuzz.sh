#!/usr/bin/env bash
# Runs one fuzz target of fuzz/ for a while, coverage-guided, on stable Rust and without
# cargo-fuzz: it builds with the flags `cargo fuzz run -s none` passes (libFuzzer's coverage
# instrumentation, debug assertions, overflow checks) and runs the binary on a corpus folder
# that grows across runs. With cargo-fuzz installed, `cd fuzz && cargo fuzz run -s none T`
# does the same.
#
#   bash scripts/fuzz.sh TARGET [SECONDS]    # TARGET: arena_ops, token_file, llmc_checkpoint,
#                                            # safetensors_gpt2, hf_index, sharded_manifest,
#                                            # tier_header;
#                                            # SECONDS: 60
#
# Corpus: fuzz/corpus/TARGET (git-ignored); a failing input lands in fuzz/artifacts/TARGET/.
# Exit status: libFuzzer's (0: no failure).
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
targets=$(sed -n 's/^name = "\(.*\)"$/\1/p' Cargo.toml | grep -vx zero-fuzz | tr '\n' ' ')
usage="usage: bash scripts/fuzz.sh TARGET [SECONDS]; targets: $targets"
if (($# < 1 || $# > 2)); then echo "fuzz.sh: $usage" >&2; exit 2; fi
target="$1"
seconds="${2:-60}"
# libFuzzer reads a max_total_time it cannot parse, or 0, as "no limit".
if ! [[ "$seconds" =~ ^[1-9][0-9]{0,6}$ ]]; then
  echo "fuzz.sh: SECONDS must be a whole number from 1 to 9999999, not '$seconds'" >&2
  exit 2
fi
if ! grep -qxF -- "$target" <<<"${targets// /$'\n'}"; then
  echo "fuzz.sh: no fuzz target '$target'; $usage" >&2
  exit 2
fi
triple="$(rustc -vV | sed -n 's/^host: //p')"
# Only the target's own code is instrumented: with --target, RUSTFLAGS skip build scripts and
# proc macros, as cargo-fuzz arranges.
export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions -Coverflow-checks"
cargo build --release --bin "$target" --target "$triple" --target-dir target/instrumented
mkdir -p "corpus/$target" "artifacts/$target"
# The llm.c parsers stop at a 1024-byte header that random bytes never reach: seed each with
# one valid file (magic and version from llm.c; the checkpoint's shape maxT=V=L=NH=C=1,
# Vp=128: 156 parameters); the tier header with one valid header.
if [ -z "$(ls -A "corpus/$target")" ]; then
    case "$target" in
        token_file) python3 -c 'import struct,sys; h=[0]*256; h[0:3]=[20240520,1,4]
sys.stdout.buffer.write(struct.pack("<256i",*h)+struct.pack("<4H",1,2,3,50256))' \
            >"corpus/$target/seed" ;;
        llmc_checkpoint) python3 -c 'import struct,sys; h=[0]*256; h[0:8]=[20240326,3,1,1,1,1,1,128]
sys.stdout.buffer.write(struct.pack("<256i",*h)+struct.pack("<156f",*[0.5]*156))' \
            >"corpus/$target/seed" ;;
        # A valid header (its FNV-1a checksum is out of random bytes' reach).
        tier_header) python3 -c 'import struct,sys
b=b"ZEROTIER"+struct.pack("<4I",1,1,2,0)+b"optimizer".ljust(16,b"\0")+struct.pack("<4Q",9,2,7,8192)
h=0xcbf29ce484222325
for x in b: h=((h^x)*0x100000001b3)%(1<<64)
sys.stdout.buffer.write((b+struct.pack("<Q",h)).ljust(4096,b"\0"))' >"corpus/$target/seed" ;;
    esac
fi
exec "target/instrumented/$triple/release/$target" -max_total_time="$seconds" \
    -artifact_prefix="artifacts/$target/" "corpus/$target"
