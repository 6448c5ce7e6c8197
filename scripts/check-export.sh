#!/usr/bin/env bash
# zero-train's safetensors export against an independent reader: trains a tiny model for two
# steps, exports it as safetensors (fp32 and bf16, one file and Hugging Face's sharded
# form) and as llm.c's model.bin, and has
# scripts/check-safetensors.py read the safetensors files with Hugging Face's `safetensors`
# package and numpy and compare them with the llm.c file tensor by tensor. The Python packages
# are installed once into a cache folder; where pip cannot get them, says why and exits 0.
#
# ZERO_RS_PY_DIR overrides the cache folder (default ~/.cache/zero-rs/py).
set -euo pipefail
cd "$(dirname "$0")/.."

py="${ZERO_RS_PY_DIR:-$HOME/.cache/zero-rs/py}"
if ! PYTHONPATH="$py" python3 -c 'import safetensors, numpy' 2>/dev/null; then
  if ! python3 -m pip --version >/dev/null 2>&1; then
    echo "check-export: SKIPPED: no python3 -m pip to fetch safetensors and numpy"
    exit 0
  fi
  mkdir -p "$py"
  if ! python3 -m pip install --quiet --disable-pip-version-check --target "$py" \
    safetensors==0.8.0 numpy==2.4.6 2>"$py.log"; then
    echo "check-export: SKIPPED: pip could not install safetensors and numpy:"
    tail -n 5 "$py.log"
    exit 0
  fi
fi

# The zero-train that `cargo test --workspace` built (nothing to compile after it).
zt=$(bash scripts/cargo-exe.sh bin zero-train --workspace)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for i in $(seq 1 400); do echo "Line $i: a tiny corpus for the export check $((i % 13))."; done \
  >"$work/corpus.txt"
run() { "$@" >"$work/log" 2>&1 || { cat "$work/log" >&2; exit 1; }; }
run "$zt" prepare --text "$work/corpus.txt" --out "$work/data"
run "$zt" --data "$work/data" --layers 2 --heads 2 --dim 32 --seq-len 16 --steps 2 \
  --batch-size 2 --micro-batch-size 1 --world-size 2 --zero-stage 3 --sample-tokens 0 \
  --eval-every 0 --save "$work/ckpt"
run "$zt" export --from "$work/ckpt" --to "$work/llmc/model.bin" --format llmc
for dtype in fp32 bf16; do
  run "$zt" export --from "$work/ckpt" --to "$work/$dtype/model.safetensors" --dtype "$dtype"
  PYTHONPATH="$py" python3 scripts/check-safetensors.py "$work/$dtype/model.safetensors" \
    "$work/llmc/model.bin"
  # Hugging Face's sharded form: shards of at most 8 KiB of tensor data.
  run "$zt" export --from "$work/ckpt" --to "$work/$dtype-sharded" --dtype "$dtype" \
    --max-shard-size 8K
  PYTHONPATH="$py" python3 scripts/check-safetensors.py "$work/$dtype-sharded" \
    "$work/llmc/model.bin"
done
